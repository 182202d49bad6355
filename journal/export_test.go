package journal

// StoreUnchecked puts rec in j as it is, in place of the record of
// rec.ActionID if there is one, bypassing Reserve's checks: a record
// damaged where it lies, for the tests of what j's reads return.
func StoreUnchecked(j *Memory, rec Record) {
	j.mu.Lock()
	defer j.mu.Unlock()
	added := j.now().Sub(j.start)
	if i := j.find(rec.ActionID); i >= 0 {
		e, _ := j.at(uint32(i))
		added = e.added
		j.remove(i)
	}
	j.insert(rec, added)
}

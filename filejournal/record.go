package filejournal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// Record types inside a payload.
const (
	opUpsert uint8 = 1 // full state of one action
	opDelete uint8 = 2 // the action was forgotten
	opEnd    uint8 = 3 // end of a compaction snapshot
	opClock  uint8 = 4 // the clock's high-water mark, so a restart keeps it
	opSeen   uint8 = 5 // the observed time (see Journal.expired), so a restart keeps it
)

// maxSeenMs bounds an observed time read from a file, so that it fits in
// nanoseconds (about 292 years).
const maxSeenMs = math.MaxInt64 / 1_000_000

// Upsert flags.
const (
	upsertCustomKey = 1 // the key is a length-prefixed string
	upsertSeen      = 2 // the observed time at creation follows the status (always set)
	// upsertForm is two bits, the key's form (journal.KeyForm: 0
	// unrecorded, 1 bare, 2 quoted; 3 is malformed), since format 1.1.
	upsertForm      = 3 << upsertFormShift
	upsertFormShift = 2
)

// rec is a journal.Record in storage form: the stored id (see
// Journal.storedID), a UUID key as 16 bytes, times in Unix milliseconds.
type rec struct {
	id       string
	custom   string // the key when it is not a canonical UUID; else ""
	key      [16]byte
	fp       [32]byte
	created  int64
	attempts uint32
	status   uint16
	state    journal.State
	form     journal.KeyForm
	// seen is the Journal's observed time, in ms, when the record was
	// created (see Journal.expired).
	seen int64
}

// op is one record of a payload.
type op struct {
	kind uint8
	// create marks, in the queue, the delete and upsert that a Reserve
	// writes for a new record (see failBatch); never in a file.
	create bool
	r      rec    // upsert: all of it; delete: r.id only
	count  uint64 // end: records in the snapshot
	clock  int64  // end, clock: the journal's clock high-water mark, Unix ms; seen: the observed time, ms
}

// toRec returns want, a record that journal.CheckRecord and checkStatus
// accepted, in storage form under the stored id id.
func toRec(id string, want journal.Record) rec {
	r := rec{id: id, fp: want.Fingerprint, created: want.CreatedAt.UnixMilli(),
		attempts: uint32(want.Attempts), status: uint16(want.Status), state: want.State, form: want.KeyForm}
	if !parseUUID(want.Key, &r.key) {
		r.custom = want.Key
	}
	return r
}

// record returns r as a journal.Record named actionID.
func (r *rec) record(actionID string) journal.Record {
	key := r.custom
	if key == "" {
		key = formatUUID(&r.key)
	}
	return r.recordKeyed(actionID, key)
}

// recordKeyed is record with key, r's key in its string form, given: the
// key of the journal.Record that r was made from (toRec), which needs no
// formatting, since parseUUID takes only the form formatUUID writes.
func (r *rec) recordKeyed(actionID, key string) journal.Record {
	return journal.Record{ActionID: actionID, Key: key, KeyForm: r.form, Fingerprint: r.fp, CreatedAt: time.UnixMilli(r.created),
		State: r.state, Attempts: int(r.attempts), Status: int(r.status)}
}

// size is r's encoded size, for the live-bytes estimate behind compaction.
func (r *rec) size() int64 {
	n := 2 + uvarintLen(uint64(len(r.id))) + len(r.id) + 32 + 1 + uvarintLen(uint64(r.attempts)) + uvarintLen(uint64(r.status))
	n += uvarintLen(zigzag(r.created)) + uvarintLen(uint64(r.seen))
	if r.custom != "" {
		n += 1 + len(r.custom)
	} else {
		n += 16
	}
	return int64(n)
}

func appendOp(b []byte, o *op) []byte {
	b = append(b, o.kind)
	switch o.kind {
	case opUpsert:
		r := &o.r
		fl := byte(upsertSeen) | byte(r.form)<<upsertFormShift&upsertForm
		if r.custom != "" {
			fl |= upsertCustomKey
		}
		b = append(b, fl)
		b = binary.AppendUvarint(b, uint64(len(r.id)))
		b = append(b, r.id...)
		if r.custom != "" {
			b = append(b, byte(len(r.custom)))
			b = append(b, r.custom...)
		} else {
			b = append(b, r.key[:]...)
		}
		b = append(b, r.fp[:]...)
		b = binary.AppendUvarint(b, zigzag(r.created))
		b = append(b, byte(r.state))
		b = binary.AppendUvarint(b, uint64(r.attempts))
		b = binary.AppendUvarint(b, uint64(r.status))
		b = binary.AppendUvarint(b, uint64(r.seen))
	case opDelete:
		b = binary.AppendUvarint(b, uint64(len(o.r.id)))
		b = append(b, o.r.id...)
	case opEnd:
		b = binary.AppendUvarint(b, o.count)
		b = binary.AppendUvarint(b, zigzag(o.clock))
	case opClock:
		b = binary.AppendUvarint(b, zigzag(o.clock))
	case opSeen:
		b = binary.AppendUvarint(b, uint64(o.clock))
	}
	return b
}

var errPayload = errors.New("malformed payload")

// decoder reads a payload. It never panics and allocates only the strings
// of the custom keys it returns.
type decoder struct {
	p   []byte
	bad bool
}

func (d *decoder) byte() byte {
	if len(d.p) < 1 {
		d.bad = true
		return 0
	}
	c := d.p[0]
	d.p = d.p[1:]
	return c
}

// uvarint accepts only the canonical (shortest) encoding, so that decoding
// then encoding is the identity.
func (d *decoder) uvarint(max uint64) uint64 {
	v, n := binary.Uvarint(d.p)
	if n <= 0 || (n > 1 && d.p[n-1] == 0) || v > max {
		d.bad = true
		return 0
	}
	d.p = d.p[n:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if n < 0 || len(d.p) < n {
		d.bad = true
		return nil
	}
	b := d.p[:n]
	d.p = d.p[n:]
	return b
}

// id returns the next id, in p.
func (d *decoder) id() []byte {
	n := d.uvarint(journal.MaxActionID)
	if d.bad || n == 0 {
		d.bad = true
		return nil
	}
	return d.bytes(int(n))
}

// decodeOps calls fn for each record of p, reusing one op: an upsert's or
// a delete's id is passed to fn as id, a slice of p, and o.r.id is empty.
// It returns errPayload (wrapped) for anything malformed, and fn's error as
// is. It allocates nothing but the strings of custom keys.
func decodeOps(p []byte, fn func(o *op, id []byte) error) error {
	var o op
	return decodeOpsInto(p, &o, fn)
}

// decodeOpsInto is decodeOps reusing o, so that a caller decoding many
// payloads allocates no op for each.
func decodeOpsInto(p []byte, o *op, fn func(o *op, id []byte) error) error {
	d := decoder{p: p}
	count := d.uvarint(uint64(len(p)))
	if d.bad {
		return fmt.Errorf("%w: count", errPayload)
	}
	for i := uint64(0); i < count; i++ {
		*o = op{kind: d.byte()}
		var id []byte
		switch o.kind {
		case opUpsert:
			fl := d.byte()
			id = d.id()
			if fl&upsertSeen == 0 {
				d.bad = true // every upsert of this format carries its observed time
			}
			if o.r.form = journal.KeyForm(fl & upsertForm >> upsertFormShift); o.r.form > journal.KeyFormQuoted {
				d.bad = true
			}
			switch fl &^ (upsertSeen | upsertForm) {
			case 0:
				copy(o.r.key[:], d.bytes(16))
			case upsertCustomKey:
				k := d.bytes(int(d.byte()))
				// A canonical UUID would have been stored as 16 bytes.
				if !d.bad && (!journal.ValidKey(string(k)) || isUUID(k)) {
					d.bad = true
				}
				// Nor is a quoted key that the quoted form cannot hold
				// (journal.CheckRecord).
				if o.r.form == journal.KeyFormQuoted && bytes.ContainsAny(k, `"\`) {
					d.bad = true
				}
				o.r.custom = string(k)
			default:
				d.bad = true
			}
			copy(o.r.fp[:], d.bytes(32))
			o.r.created = unzigzag(d.uvarint(math.MaxUint64))
			if o.r.created < journal.MinCreatedAtUnixMilli || o.r.created > journal.MaxCreatedAtUnixMilli {
				d.bad = true // no Reserve stores it (journal.CheckRecord): crafted, or damaged
			}
			o.r.state = journal.State(d.byte())
			if o.r.state < journal.StatePending || o.r.state > journal.StateUnknown {
				d.bad = true
			}
			o.r.attempts = uint32(d.uvarint(math.MaxInt32))
			o.r.status = uint16(d.uvarint(math.MaxUint16))
			o.r.seen = int64(d.uvarint(maxSeenMs))
		case opDelete:
			id = d.id()
		case opEnd:
			o.count = d.uvarint(math.MaxUint64)
			o.clock = unzigzag(d.uvarint(math.MaxUint64))
		case opClock:
			o.clock = unzigzag(d.uvarint(math.MaxUint64))
		case opSeen:
			o.clock = int64(d.uvarint(maxSeenMs))
		default:
			d.bad = true
		}
		if d.bad {
			return fmt.Errorf("%w: record %d", errPayload, i)
		}
		if err := fn(o, id); err != nil {
			return err
		}
	}
	if len(d.p) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errPayload, len(d.p))
	}
	return nil
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

const hexDigits = "0123456789abcdef"

func isUUID(b []byte) bool {
	var k [16]byte
	return parseUUID(string(b), &k)
}

// parseUUID accepts only the canonical lowercase 8-4-4-4-12 form, the one
// formatUUID produces, so that a stored key always reads back identical.
// The digits' places are fixed (uuidDigits): no branch per byte, and one
// check of all of them at the end.
func parseUUID(s string, out *[16]byte) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		*out = [16]byte{}
		return false
	}
	var bad byte
	for j, i := range uuidDigits {
		hi, lo := unhexTable[s[i]], unhexTable[s[i+1]]
		bad |= hi | lo
		out[j] = hi<<4 | lo
	}
	if bad > 15 { // unhex is 255 for a byte that is no lowercase digit
		*out = [16]byte{}
		return false
	}
	return true
}

// uuidDigits is where each byte's two digits begin in the canonical form.
var uuidDigits = [16]uint8{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}

// unhexTable is unhex of every byte: a lookup has no branch to mispredict
// on the random digits of a key.
var unhexTable = func() (t [256]byte) {
	for c := range t {
		t[c] = unhex(byte(c))
	}
	return t
}()

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return 255
}

func formatUUID(k *[16]byte) string {
	var b [36]byte
	j := 0
	for i, c := range k {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hexDigits[c>>4], hexDigits[c&15]
		j += 2
	}
	return string(b[:])
}

// damagedUpsert is an upsert read from a payload that failed its checks
// (see damagedUpserts): its stored id and its key, either of which may be
// damaged.
type damagedUpsert struct {
	id     string
	key    [16]byte
	custom string
}

// damagedUpserts returns the upserts of p, a payload that failed its
// checks, read as far as its structure goes and no further: the values
// are not checked, and without a checksum that holds (a damaged frame) any
// id or key may be damaged too. They name the records a damaged frame may
// have held (CorruptionError.Actions), never records to use.
func damagedUpserts(p []byte) []damagedUpsert {
	d := decoder{p: p}
	count := d.uvarint(uint64(len(p)))
	var ups []damagedUpsert
	for i := uint64(0); i < count && !d.bad; i++ {
		switch d.byte() {
		case opUpsert:
			fl := d.byte()
			id := d.id()
			if d.bad {
				return ups
			}
			u := damagedUpsert{id: string(id)}
			if fl&upsertCustomKey != 0 {
				u.custom = string(d.bytes(int(d.byte())))
			} else {
				copy(u.key[:], d.bytes(16))
			}
			ups = append(ups, u)
			d.bytes(32)
			d.uvarint(math.MaxUint64) // created
			d.byte()                  // state
			for range 3 {             // attempts, status, seen
				d.uvarint(math.MaxUint64)
			}
		case opDelete:
			d.id()
		case opEnd:
			d.uvarint(math.MaxUint64)
			d.uvarint(math.MaxUint64)
		case opClock, opSeen:
			d.uvarint(math.MaxUint64)
		default:
			return ups
		}
	}
	return ups
}

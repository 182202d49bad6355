// Package datasync makes written data durable the way the file journal does
// on each OS: a file's data with File (fdatasync on Linux, File.Sync
// elsewhere), a directory's entries with Dir (fsync on Unix, nothing where
// there is no directory sync), so that the journal and the benchmark probe
// that judges it make the same calls.
package datasync

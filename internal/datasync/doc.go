// Package datasync makes a file's written data durable the way the file
// journal does on each OS (fdatasync on Linux, File.Sync elsewhere), so that
// the journal and the benchmark probe that judges it make the same call.
package datasync

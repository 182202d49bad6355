package sqljournal_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cluster is a PostgreSQL server of one test's own, made by .ci/postgres.sh
// in a fresh directory, for faults that would disturb the shared server:
// stopping it, pausing it. It is stopped and deleted when the test ends.
type cluster struct {
	t      *testing.T
	base   string // IDEMRETRY_PG_BASE of postgres.sh
	dsn    string
	bindir string
	port   string
	paused []int
}

// ownCluster starts a cluster for t. It is skipped (failed under CI) when
// the tests have no PostgreSQL or this machine has no server binaries.
func ownCluster(t *testing.T) *cluster {
	t.Helper()
	testDB(t) // skip or fail as every PostgreSQL test does
	bindir := serverBindir()
	if bindir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin, and CI=true")
		}
		t.Skip("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: cannot start a cluster of the test's own")
	}
	var b [6]byte
	rand.Read(b[:])
	// Not t.TempDir: the cluster runs as user postgres when we are root,
	// and postgres.sh makes the directory itself, for that user.
	c := &cluster{t: t, base: filepath.Join(os.TempDir(), "sqlj-fault-"+hex.EncodeToString(b[:])), bindir: bindir}
	script := filepath.Join("..", ".ci", "postgres.sh")
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), "IDEMRETRY_PG_BASE="+c.base)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Cleanup(c.remove)
	if err != nil {
		t.Fatalf("start a cluster: %v\n%s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "export IDEMRETRY_PG_DSN="); ok {
			c.dsn = strings.Trim(v, "'")
		}
	}
	port, err := os.ReadFile(filepath.Join(c.base, "port"))
	if c.dsn == "" || err != nil {
		t.Fatalf("postgres.sh printed no DSN (%q) or port (%v)", out, err)
	}
	c.port = strings.TrimSpace(string(port))
	return c
}

// serverBindir returns the newest installed server's bin directory, or "".
func serverBindir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d
		}
	}
	return ""
}

// db returns a pool on the cluster, closed when the test ends. opts may
// adjust it before the first connection.
func (c *cluster) db() *sql.DB {
	db, err := sql.Open("pgx", c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	c.t.Cleanup(func() { db.Close() })
	return db
}

// pgCtl runs pg_ctl on the cluster's data as its owner.
func (c *cluster) pgCtl(args ...string) error {
	args = append([]string{filepath.Join(c.bindir, "pg_ctl"), "-D", filepath.Join(c.base, "data")}, args...)
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = c.base
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Logf("pg_ctl %v: %v\n%s", args, err, out)
	}
	return err
}

// stop stops the server at once, as a crash would (immediate mode: no
// checkpoint, clients cut off).
func (c *cluster) stop() {
	c.t.Helper()
	if err := c.pgCtl("-m", "immediate", "-w", "stop"); err != nil {
		c.t.Fatalf("stop the cluster: %v", err)
	}
}

// start starts the stopped server again on its port.
func (c *cluster) start() {
	c.t.Helper()
	if err := c.pgCtl("-l", filepath.Join(c.base, "server.log"), "-w", "-t", "60", "-o", "-p "+c.port, "start"); err != nil {
		c.t.Fatalf("start the cluster again: %v", err)
	}
}

// pause stops every process of the server with SIGSTOP: connections stay
// open and new ones are accepted by the kernel, but nothing answers.
func (c *cluster) pause() {
	c.t.Helper()
	pids := c.pids()
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			c.t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
	}
	c.paused = pids
}

// resume undoes pause.
func (c *cluster) resume() {
	for _, pid := range c.paused {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	c.paused = nil
}

// pids lists the postmaster and its children.
func (c *cluster) pids() []int {
	c.t.Helper()
	pidFile, err := os.ReadFile(filepath.Join(c.base, "data", "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("postmaster.pid: %v", err)
	}
	postmaster, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(pidFile), "\n", 2)[0]))
	if err != nil {
		c.t.Fatalf("postmaster.pid: %v", err)
	}
	pids := []int{postmaster}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// remove resumes, stops and deletes the cluster.
func (c *cluster) remove() {
	c.resume()
	cmd := exec.Command("bash", filepath.Join("..", ".ci", "postgres.sh"), "stop")
	cmd.Env = append(os.Environ(), "IDEMRETRY_PG_BASE="+c.base)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Errorf("remove the cluster in %s: %v\n%s", c.base, err, out)
	}
}

// within fails t unless f returns within d, and returns how long it took.
func within(t *testing.T, d time.Duration, what string, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); f() }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return 0
	}
}

var _ = context.Background

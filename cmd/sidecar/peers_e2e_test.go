package main_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// writeSecret writes a peers secret file of mode mode and returns its
// path.
func writeSecret(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "peers.secret")
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func loopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// --peers without a secret file, or with one others may read, or too
// short, refuses to start (exit 2) and says how to make one.
func TestPeersSecretRequired(t *testing.T) {
	need(t)
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"none", nil, "head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"},
		{"group readable", []string{"--peers-secret-file", writeSecret(t, strings.Repeat("s", 44), 0o640)}, "chmod 600"},
		{"short", []string{"--peers-secret-file", writeSecret(t, "short\n", 0o600)}, "at least 32"},
	} {
		args := append(append([]string{"run", "--live", "off", "--job-id", "j", "--peers", "127.0.0.1:29601"}, tc.args...), "--", "true")
		code, _, stderr := runGaptrace(t, env(t), args...)
		if code != 2 || !strings.Contains(stderr, tc.says) {
			t.Errorf("%s: exit %d, want 2 saying %q\n%s", tc.name, code, tc.says, stderr)
		}
	}
}

// Two sidecars of one job join over --peers while an outsider asks the
// exchange with a wrong job ID (it was answered with the real one and, on
// retrying with it, given every rank's records): it learns nothing, and
// the job's sidecars run on and exit 0.
func TestPeersOutsiderE2E(t *testing.T) {
	need(t)
	secret := writeSecret(t, "ZTJlLXNlY3JldC1lMmUtc2VjcmV0LWUyZS1zZWNyZXQK\n", 0o600)
	addr := loopbackAddr(t)
	var ps []*gtProc
	for _, rank := range []string{"0", "1"} {
		ps = append(ps, start(t, env(t), "run", "--live", "off", "--log-level", "info", "--spans-out", "none",
			"--job-id", "secretjob-42", "--rank", rank, "--peers", addr, "--peers-secret-file", secret, "--", "sleep", "8"))
	}
	joined := regexp.MustCompile(`peer exchange: (member joined|joined hub)`)
	deadline := time.Now().Add(time.Minute)
	for !joined.MatchString(ps[0].stderr.String()) || !joined.MatchString(ps[1].stderr.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("the sidecars did not join:\n%s\n---\n%s", ps[0].stderr, ps[1].stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, `{"t":"hello","job":"wrongjob","id":"x","v":1}`+"\n"+
		`{"t":"hello","job":"secretjob-42","id":"x","v":1}`+"\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(c)
	if len(got) != 0 {
		t.Errorf("the exchange answered an outsider: %q", got)
	}
	for i, p := range ps {
		if code := p.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("sidecar %d: exit %d\n%s", i, code, p.stderr)
		}
	}
}

// A program that bound the exchange's port first (an unprivileged user
// can) is not joined: it hears a nonce and nothing else — no job ID, no
// sidecar ID, no record — and gives the sidecar no clock offset (root
// sidecars joined such a listener and took +1 h from it).
func TestPeersImpostorE2E(t *testing.T) {
	need(t)
	secret := writeSecret(t, "ZTJlLXNlY3JldC1lMmUtc2VjcmV0LWUyZS1zZWNyZXQK\n", 0o600)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var heard strings.Builder
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				l, _ := br.ReadString('\n')
				// The sidecar may hang up on the forged challenge: what
				// it read is checked below, not whether these got through.
				_, _ = io.WriteString(c, `{"t":"challenge","n":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","mac":"AAAA"}`+"\n")
				_, _ = io.WriteString(c, `{"t":"pong","t1":1,"t2":3600000000000}`+"\n")
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				rest, _ := io.ReadAll(br)
				mu.Lock()
				heard.WriteString(l)
				heard.Write(rest)
				mu.Unlock()
			}()
		}
	}()
	p := start(t, env(t), "run", "--live", "off", "--log-level", "info", "--spans-out", "none",
		"--job-id", "secretjob-42", "--rank", "0", "--peers", ln.Addr().String(), "--peers-secret-file", secret, "--", "sleep", "4")
	p.waitFor(t, regexp.MustCompile(`did not prove the peers secret`), time.Minute)
	if code := p.wait(t, 2*time.Minute); code != 0 {
		t.Errorf("exit %d\n%s", code, p.stderr)
	}
	ln.Close()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	got := heard.String()
	mu.Unlock()
	for _, secret := range []string{"secretjob-42", `"hello"`, `"recs"`, `"ping"`} {
		if strings.Contains(got, secret) {
			t.Errorf("the impostor heard %s: %q", secret, got)
		}
	}
	if strings.Contains(p.stderr.String(), "joined hub") {
		t.Errorf("the sidecar joined the impostor:\n%s", p.stderr)
	}
}

// A run killed with kill -9 leaves the temporary file of its trace
// (.NAME.PID.*.tmp); the next run on the same output removes it.
func TestKilledRunTemporaryRemoved(t *testing.T) {
	need(t)
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.json")
	p := start(t, env(t), "run", "--live", "off", "--spans-out", "none", "--perfetto-out", trace, "--", "sleep", "60")
	deadline := time.Now().Add(2 * time.Minute)
	var left []string
	for len(left) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no temporary file of the trace appeared\n%s", p.stderr)
		}
		left, _ = filepath.Glob(filepath.Join(dir, ".trace.json.*.tmp"))
		time.Sleep(50 * time.Millisecond)
	}
	testutil.KillGroup(t, p.cmd.Process.Pid)
	p.wait(t, time.Minute)
	if _, err := os.Lstat(left[0]); err != nil {
		t.Fatalf("the killed run's temporary file is gone already: %v", err)
	}
	gaps := filepath.Join(dir, "gaps.jsonl")
	if err := os.WriteFile(gaps, []byte(`{"pid":1,"tid":1,"device":0,"step":0,"kind":"idle","start_unix_nano":1700000000000000000,"end_unix_nano":1700000000001000000,"duration_ns":1000000,"cause":"io.read"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runGaptrace(t, env(t), "convert", "--from", gaps, "--perfetto-out", trace)
	if code != 0 {
		t.Fatalf("convert: exit %d\n%s", code, stderr)
	}
	if now, _ := filepath.Glob(filepath.Join(dir, ".trace.json.*.tmp")); len(now) != 0 {
		t.Errorf("temporary files left after the next run: %v", now)
	}
}

package cli

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type fakeDumper struct{ calls int }

func (f *fakeDumper) Dump() ([]byte, error) {
	f.calls++
	return []byte(`{"in_flight":[],"processes":[]}` + "\n"), nil
}

func dumpDeps(dir string, stdout, stderr *bytes.Buffer) Deps {
	d := Deps{Stdout: stdout, Stderr: stderr, LookupEnv: func(k string) (string, bool) {
		if k == RunDirEnv {
			return dir, true
		}
		return "", false
	}}
	d.fill()
	return d
}

// A session serves its dump on a socket only its user can open; gaptrace
// dump finds the one session and prints what it sent.
func TestDumpOverSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	var log bytes.Buffer
	f := &fakeDumper{}
	s := startDump(f, func(k string) string { return map[string]string{RunDirEnv: dir}[k] }, slog.New(slog.NewTextHandler(&log, nil)))
	if s == nil {
		t.Fatalf("no dump server: %s", log.String())
	}
	defer s.stop()
	for path, want := range map[string]os.FileMode{dir: 0o700, s.path: 0o600} {
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, st.Mode().Perm(), err, want)
		}
	}
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"dump"}, dumpDeps(dir, &out, &errb)); rc != ExitOK {
		t.Fatalf("gaptrace dump: exit %d: %s", rc, errb.String())
	}
	if !strings.Contains(out.String(), `"in_flight"`) || f.calls != 1 {
		t.Errorf("dump printed %q after %d calls", out.String(), f.calls)
	}
	s.stop()
	out.Reset()
	errb.Reset()
	if rc := Main(context.Background(), []string{"dump"}, dumpDeps(dir, &out, &errb)); rc != ExitFailure ||
		!strings.Contains(errb.String(), "no running gaptrace session") {
		t.Errorf("no session: exit %d, %q", rc, errb.String())
	}
}

// A run directory open to others is refused: tracing goes on, without
// dumps, and says why.
func TestDumpRefusesOpenDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	s := startDump(&fakeDumper{}, func(k string) string { return map[string]string{RunDirEnv: dir}[k] }, slog.New(slog.NewTextHandler(&log, nil)))
	if s != nil {
		s.stop()
		t.Fatal("served dumps from a directory of mode 0777")
	}
	if !strings.Contains(log.String(), "mode 0700") {
		t.Errorf("log %q does not say why", log.String())
	}
}

func TestDumpUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"dump", "--pid", "-3"}, dumpDeps(t.TempDir(), &out, &errb)); rc != ExitFailure {
		t.Errorf("--pid -3: exit %d", rc)
	}
	if rc := Main(context.Background(), []string{"dump", "extra"}, dumpDeps(t.TempDir(), &out, &errb)); rc != ExitFailure {
		t.Errorf("extra argument: exit %d", rc)
	}
}

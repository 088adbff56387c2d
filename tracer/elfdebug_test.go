package tracer

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const elfDebugProg = `#include <stdio.h>
static int __attribute__((noinline)) hidden_work(int n)
{
	int s = 0;
	for (int i = 0; i < n; i++)
		s += i * n; /* LINE_OF_WORK */
	return s;
}
int main(int argc, char **argv) { printf("%d\n", hidden_work(argc)); return 0; }
`

// buildProg compiles elfDebugProg with -g into dir and returns its path
// and the source line marked LINE_OF_WORK.
func buildProg(t *testing.T, dir string) (string, int) {
	t.Helper()
	for _, tool := range []string{"gcc", "objcopy", "strip", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	src := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(src, []byte(elfDebugProg), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	if out, err := exec.Command("gcc", "-O1", "-g", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	line := 0
	for i, l := range strings.Split(elfDebugProg, "\n") {
		if strings.Contains(l, "LINE_OF_WORK") {
			line = i + 1
		}
	}
	return bin, line
}

// lineWhenRead is ef.line once the file's line table has been read: on a
// loaded machine the first lookup may come back before it is.
func lineWhenRead(ef *elfFile, vaddr uint64) (string, int) {
	if src, ln, pending := ef.line(vaddr); !pending {
		return src, ln
	}
	<-ef.linesDone
	src, ln, _ := ef.line(vaddr)
	return src, ln
}

func symAddr(t *testing.T, path, name string) uint64 {
	t.Helper()
	e, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	syms, err := e.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s.Value
		}
	}
	t.Fatalf("%s: no symbol %s", path, name)
	return 0
}

// TestNativeLinesAndMiniDebugInfo: a binary built with -g gives its
// frames' source file and line; a stripped one that carries its symbol
// table in .gnu_debugdata (MiniDebugInfo) still names its static
// functions; a stripped one without it names none and has no lines.
func TestNativeLinesAndMiniDebugInfo(t *testing.T) {
	dir := t.TempDir()
	bin, line := buildProg(t, dir)
	addr := symAddr(t, bin, "hidden_work")

	ef := loadELF(bin)
	if ef.err != nil {
		t.Fatal(ef.err)
	}
	// Somewhere inside the function's loop: every address of the function
	// maps to a line of prog.c between its opening and closing lines.
	name, _, ok := ef.lookupVaddr(addr + 4)
	if !ok || name != "hidden_work" {
		t.Fatalf("lookup: %q %v, want hidden_work", name, ok)
	}
	src, ln := lineWhenRead(ef, addr+4)
	if filepath.Base(src) != "prog.c" || ln < line-4 || ln > line+2 {
		t.Errorf("line of hidden_work+4: %s:%d, want prog.c near line %d", src, ln, line)
	}

	// MiniDebugInfo: the symbol table moves into an xz-compressed ELF.
	mini := filepath.Join(dir, "mini")
	stripped := filepath.Join(dir, "prog.stripped")
	for _, c := range [][]string{
		{"objcopy", "--only-keep-debug", bin, mini},
		{"objcopy", "--strip-debug", mini},
		{"xz", "-f", mini},
		{"strip", "--strip-all", "-o", stripped, bin},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	plain := loadELF(stripped)
	if name, _, ok := plain.lookupVaddr(addr + 4); ok && name == "hidden_work" {
		t.Fatalf("a stripped binary still names hidden_work: the test proves nothing")
	}
	if out, err := exec.Command("objcopy", "--add-section", ".gnu_debugdata="+mini+".xz", stripped).CombinedOutput(); err != nil {
		t.Fatalf("objcopy --add-section: %v\n%s", err, out)
	}
	withMini := loadELF(stripped)
	if name, _, ok := withMini.lookupVaddr(addr + 4); !ok || name != "hidden_work" {
		t.Errorf("stripped binary with .gnu_debugdata: %q %v, want hidden_work", name, ok)
	}
	if _, ln := lineWhenRead(withMini, addr+4); ln != 0 {
		t.Errorf("stripped binary has a line %d: it has no line table", ln)
	}
}

// TestLargeLineTableReadAside: a line table that takes long to parse (a Go
// program's DWARF, well over a hundred thousand rows) does not hold up the
// lookup that first needs it beyond lineWait: the lookup says the line is
// pending, and once the table is read the same address has its line.
func TestLargeLineTableReadAside(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not installed")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"loader\") }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "loader")
	cmd := exec.Command(goTool, "build", "-o", exe, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr := symAddr(t, exe, "main.main")

	ef := loadELF(exe)
	if ef.err != nil {
		t.Fatal(ef.err)
	}
	ef.path = "/job/bin/loader" // the job's own code: its lines are read
	_, _, pending := ef.line(addr + 8)
	<-ef.linesDone
	if !pending {
		// Read within lineWait: possible on a fast machine, and what a
		// small table does; the wait is bounded either way.
		t.Logf("%d rows read within %v", len(ef.lines), lineWait)
	}
	src2, ln, pending := ef.line(addr + 8)
	if pending || ln == 0 || filepath.Base(src2) != "main.go" {
		t.Errorf("after the table was read: %s:%d pending %v, want main.go and a line", src2, ln, pending)
	}

	// gaptrace's own executable (what a job started by gaptrace runs
	// until its exec): never read, never pending.
	self := loadELF(exe)
	self.path, self.noLines = "/job/bin/loader", true
	if src, ln, pending := self.line(addr + 8); pending || ln != 0 || src != "" {
		t.Errorf("own executable: %s:%d pending %v, want no line", src, ln, pending)
	}
}

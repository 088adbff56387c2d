// Package sizelimit holds the repository's size rule for hand-written
// source and the check that enforces it: no Go or C file (.go, .c, .h) over
// MaxFileLines lines. A file that long holds more than one concern, and is
// where a reader loses the thread. (The rule's twin, no Go function over
// 120 lines, is the linter's: funlen in .golangci.yml.)
//
// Generated files are exempt: bpf2go's objects (*_bpfel.go, *_bpfeb.go) and
// any file that says "Code generated ... DO NOT EDIT." in its first lines,
// as are build outputs and vendored code (the directories skipped by
// skipDir). The repository's own test (TestRepositorySizeLimits) runs the
// check over the whole tree.
package sizelimit

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// MaxFileLines is the most lines a hand-written source file may have.
const MaxFileLines = 600

// Violation is one file over the limit.
type Violation struct {
	Path  string // slash-separated, relative to the checked root
	Lines int
	Limit int
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %d lines, over the limit of %d for a file", v.Path, v.Lines, v.Limit)
}

// generatedRE is Go's convention for generated files (go help generate),
// accepted in a C comment too.
var generatedRE = regexp.MustCompile(`^(//|/\*|\s\*)\s*Code generated .* DO NOT EDIT\.`)

// headerLines is how far into a file the generated marker is looked for.
const headerLines = 40

// skipDir reports whether a directory holds no hand-written source: version
// control and hidden directories, vendored code, and the build outputs at
// the root (bin, build, out: the Makefile's).
func skipDir(rel, name string) bool {
	if rel == "." {
		return false
	}
	if strings.HasPrefix(name, ".") || name == "vendor" || name == "node_modules" {
		return true
	}
	switch rel {
	case "bin", "build", "out":
		return true
	}
	return false
}

// isSource reports whether name is a Go or C source or header.
func isSource(name string) bool {
	switch filepath.Ext(name) {
	case ".go", ".c", ".h":
		return true
	}
	return false
}

// Generated reports whether src is a generated file: a bpf2go object by
// its name, or any file with the generated marker in its first lines.
func Generated(name string, src []byte) bool {
	if strings.HasSuffix(name, "_bpfel.go") || strings.HasSuffix(name, "_bpfeb.go") {
		return true
	}
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for i := 0; i < headerLines && sc.Scan(); i++ {
		if generatedRE.Match(sc.Bytes()) {
			return true
		}
	}
	return false
}

// Check walks root and returns every hand-written source file over the
// limit, sorted by path. An unreadable file is an error: a check that skips
// what it cannot read proves nothing.
func Check(root string) ([]Violation, error) {
	var out []Violation
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skipDir(rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !isSource(d.Name()) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if v, bad := CheckFile(rel, src); bad {
			out = append(out, v)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, err
}

// CheckFile checks one file's source; rel names it in the violation, and
// bad says whether there is one.
func CheckFile(rel string, src []byte) (v Violation, bad bool) {
	if Generated(filepath.Base(rel), src) {
		return Violation{}, false
	}
	if n := countLines(src); n > MaxFileLines {
		return Violation{Path: rel, Lines: n, Limit: MaxFileLines}, true
	}
	return Violation{}, false
}

// countLines counts lines as wc -l does, plus a last line without a
// newline.
func countLines(src []byte) int {
	n := bytes.Count(src, []byte{'\n'})
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

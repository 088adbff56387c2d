// Package sizelimit holds the repository's size rules for hand-written
// source and the check that enforces them: no Go or C file (.go, .c, .h)
// over MaxFileLines lines, and no C function over MaxFuncLines lines. A
// file that long holds more than one concern and a function that long more
// than one step: both are where a reader loses the thread. (The same
// function rule for Go is the linter's: funlen in .golangci.yml, with the
// same count.)
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

// The limits: lines of a hand-written source file, and lines of a C
// function's body (between its braces, as funlen counts Go's).
const (
	MaxFileLines = 600
	MaxFuncLines = 120
)

// Violation is one file or C function over its limit.
type Violation struct {
	Path  string // slash-separated, relative to the checked root
	Line  int    // the function's opening brace; 0 for a whole file
	Func  string // the function's signature line; "" for a whole file
	Lines int
	Limit int
}

func (v Violation) String() string {
	if v.Func == "" {
		return fmt.Sprintf("%s: %d lines, over the limit of %d for a file", v.Path, v.Lines, v.Limit)
	}
	return fmt.Sprintf("%s:%d: %s: %d lines, over the limit of %d for a function", v.Path, v.Line, v.Func, v.Lines, v.Limit)
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

// Check walks root and returns every hand-written source file and C
// function over its limit, sorted by path and line. An unreadable file is
// an error: a check that skips what it cannot read proves nothing.
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
		out = append(out, CheckFile(rel, src)...)
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Line < out[j].Line
	})
	return out, err
}

// CheckFile checks one file's source; rel names it in the violations.
func CheckFile(rel string, src []byte) []Violation {
	if Generated(filepath.Base(rel), src) {
		return nil
	}
	var out []Violation
	if n := countLines(src); n > MaxFileLines {
		out = append(out, Violation{Path: rel, Lines: n, Limit: MaxFileLines})
	}
	if ext := filepath.Ext(rel); ext == ".c" || ext == ".h" {
		out = append(out, LongCFuncs(rel, src, MaxFuncLines)...)
	}
	return out
}

// LongCFuncs returns the C functions in src whose bodies run over limit
// lines. The source is in the kernel's style, as the repository's C is: a
// function's body opens with a "{" alone at the start of a line and
// closes with the next "}" alone at the start of a line; its signature is
// the last line before the "{" that starts at column 0.
func LongCFuncs(rel string, src []byte, limit int) []Violation {
	var out []Violation
	lines := strings.Split(string(src), "\n")
	open, sig := 0, ""
	for i, l := range lines {
		l = strings.TrimRight(l, " \t\r")
		switch {
		case l == "{" && i > 0:
			open, sig = i+1, signature(lines, i)
		case l == "}" && open > 0:
			if n := i + 1 - open - 1; n > limit {
				out = append(out, Violation{Path: rel, Line: open, Func: sig, Lines: n, Limit: limit})
			}
			open = 0
		}
	}
	return out
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

// signature is the first line of the signature above the "{" at line i
// (0-based): the last line before it that starts at column 0.
func signature(lines []string, i int) string {
	for j := i - 1; j >= 0; j-- {
		if l := lines[j]; l != "" && l[0] != ' ' && l[0] != '\t' {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[i-1])
}

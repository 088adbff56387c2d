// Package docs holds gaptrace's documentation; its test checks that the
// index and the validation summary point at what exists.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// slug is the anchor GitHub gives a heading: lower case, everything but
// letters, digits, spaces, hyphens and underscores dropped, spaces made
// hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the heading anchors of a markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if m := regexp.MustCompile(`^#{1,6} (.+)$`).FindStringSubmatch(line); m != nil && !inCode {
			out[slug(m[1])] = true
		}
	}
	return out
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// checkLinks checks every relative link of text, read from file: the
// file it names exists and so does the heading its anchor names.
func checkLinks(t *testing.T, file, text string) int {
	t.Helper()
	n := 0
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		target := m[1]
		if strings.Contains(target, "://") {
			continue
		}
		path, anchor, _ := strings.Cut(target, "#")
		if path == "" {
			path = file
		} else {
			path = filepath.Join(filepath.Dir(file), path)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s links %s: %v", file, target, err)
			continue
		}
		if anchor != "" && !anchors(t, path)[anchor] {
			t.Errorf("%s links %s: no such heading in %s", file, target, path)
		}
		n++
	}
	return n
}

func TestIndexLinks(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := checkLinks(t, "README.md", string(b)); n < 7 {
		t.Errorf("the index links %d pages", n)
	}
	// Every page of docs/ is in the index.
	pages, _ := filepath.Glob("*.md")
	for _, p := range pages {
		if p != "README.md" && !strings.Contains(string(b), "("+p) {
			t.Errorf("docs/%s is not in docs/README.md", p)
		}
	}
}

// TestValidationSummary: the summary opens validation.md, and each of its
// figures links a dated section that exists.
func TestValidationSummary(t *testing.T) {
	b, err := os.ReadFile("validation.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## Current figures\n")
	first := strings.Index(s, "\n## 1. ")
	if start < 0 || first < start {
		t.Fatal("validation.md does not open with its current figures")
	}
	summary := s[start:first]
	for _, table := range []string{"**Steps counted**", "**Attribution accuracy:**", "**Overhead:**", "**GPU results**"} {
		if !strings.Contains(summary, table) {
			t.Errorf("the summary has no %s table", table)
		}
	}
	rows := 0
	for _, line := range strings.Split(summary, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| what |") || strings.HasPrefix(line, "| loop |") {
			continue
		}
		rows++
		if !regexp.MustCompile(`\[§\d+\]\(#\d+-[^)]*20\d\d-\d\d-\d\d[^)]*\)`).MatchString(line) {
			t.Errorf("row without a link to a dated section: %s", line)
		}
	}
	if rows < 12 {
		t.Errorf("%d rows in the summary", rows)
	}
	if n := checkLinks(t, "validation.md", summary); n < rows {
		t.Errorf("%d links for %d rows", n, rows)
	}
}

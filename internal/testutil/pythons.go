package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Pythons lists the CPython interpreters on this machine worth testing
// against, one per real file: the distribution's /usr/bin/python3 first
// (Debian's is a static build: the interpreter is in the executable),
// python3 on PATH, /usr/bin/python3.X and pyenv's 3.9–3.13 builds (they
// link libpython), the newest last. It skips the test when there is none.
func Pythons(t testing.TB) []string {
	t.Helper()
	cands := []string{"/usr/bin/python3", "python3"}
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		root = filepath.Join(os.Getenv("HOME"), ".pyenv")
	}
	for minor := 9; minor <= 13; minor++ {
		cands = append(cands, fmt.Sprintf("/usr/bin/python3.%d", minor))
		m, _ := filepath.Glob(filepath.Join(root, "versions", fmt.Sprintf("3.%d.*", minor), "bin", fmt.Sprintf("python3.%d", minor)))
		cands = append(cands, m...)
	}
	seen := map[string]bool{}
	var out []string
	for _, c := range cands {
		p, err := exec.LookPath(c)
		if err != nil || strings.Contains(p, "/shims/") {
			continue
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		out = append(out, p)
	}
	if len(out) == 0 {
		t.Skip("no python3 installed")
	}
	return out
}

package peers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// Bounds of the shared secret: at least 32 bytes (base64 of 24 random
// bytes), at most 4 KiB.
const (
	minSecret = 32
	maxSecret = 4 << 10
)

// SecretHint says how to make a secret file.
const SecretHint = "make one with: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE " +
	"(the same file for every sidecar of the job; in Kubernetes a Secret mounted with defaultMode 0400)"

// LoadSecret reads the exchange's shared secret from path: a regular file
// that neither group nor others may read or write, holding at least 32
// bytes (white space at its ends aside).
func LoadSecret(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("--peers needs --peers-secret-file FILE: the sidecars of a job prove to each other that they hold it; " + SecretHint)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--peers-secret-file: %w; %s", err, SecretHint)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("--peers-secret-file: %w", err)
	}
	switch {
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("--peers-secret-file %s: not a regular file (%s)", path, st.Mode().Type())
	case st.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("--peers-secret-file %s: mode %04o lets group or others read or write it: chmod 600 %s", path, st.Mode().Perm(), path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return nil, fmt.Errorf("--peers-secret-file %s: %w", path, err)
	}
	if len(b) > maxSecret {
		return nil, fmt.Errorf("--peers-secret-file %s: longer than %d bytes", path, maxSecret)
	}
	b = bytes.TrimSpace(b)
	if len(b) < minSecret {
		return nil, fmt.Errorf("--peers-secret-file %s: %d bytes, want at least %d; %s", path, len(b), minSecret, SecretHint)
	}
	return b, nil
}

package cli

import (
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// The redacted mode of --command-line: which parts of a command line are
// secrets. The rules are written for training jobs and the tools that
// start them (launchers, shells, env, curl, database clients); what they
// cannot see is listed in docs/security.md. Redacting too much costs the
// operator a readable command line, too little leaks a credential into
// every span and log line, so the rules err towards hiding, except where
// a look-alike is common in training (--tokenizer, --key-dim, -p1).

// A name (of an option, a variable, a header, a JSON key) is split into
// words at '-', '_', '.' and camel case, lowercased: --hf_token, HF_TOKEN
// and hfToken all become "hf", "token".
var (
	// secretWords name a secret wherever they stand in the name
	// (--auth-file, DB_PASSWORD_FILE, client_secret).
	secretWords = words("passphrase", "passcode", "auth", "authorization", "oauth", "cookie", "cookies", "creds",
		"apikey", "accesskey", "secretkey", "privatekey", "privkey", "authkey", "jwt")
	// secretSubwords do so inside a glued word too (PGPASSWORD, clientsecret).
	secretSubwords = []string{"passw", "secret", "credential"}
	// lastWords name a secret only as the name's last word, or before a
	// last "id" (--api-key, AWS_ACCESS_KEY_ID, --session-id), so that
	// --key-dim, --token-budget and --session-dir stay visible.
	lastWords = words("key", "token", "pass", "pwd", "pw", "session", "cred")
)

func words(ws ...string) map[string]bool {
	m := make(map[string]bool, len(ws))
	for _, w := range ws {
		m[w] = true
	}
	return m
}

// nameWords splits a name into lowercase words.
func nameWords(name string) []string {
	var out []string
	var cur []rune
	rs := []rune(strings.TrimLeft(name, "-"))
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	for i, r := range rs {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			flush()
			continue
		}
		if unicode.IsUpper(r) && i > 0 {
			prev := rs[i-1]
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				flush()
			}
		}
		cur = append(cur, r)
	}
	flush()
	return out
}

// secretName reports whether the value of an option or variable so named
// is a secret. A negated option (--no-auth) takes no value.
func secretName(name string) bool {
	ws := nameWords(name)
	if len(ws) == 0 || ws[0] == "no" {
		return false
	}
	for i, w := range ws {
		if secretWords[w] {
			return true
		}
		for _, sub := range secretSubwords {
			if strings.Contains(w, sub) {
				return true
			}
		}
		last := i == len(ws)-1
		if lastWords[w] && (last || (i == len(ws)-2 && ws[i+1] == "id")) {
			return true
		}
		// authtoken, hftoken, accesstoken; not tokenizer.
		if last && strings.HasSuffix(w, "token") {
			return true
		}
	}
	return false
}

// optionName matches what may stand before '=' or be an option: dashes, then
// an identifier (--api-key, API_KEY, -Djava.prop, db.password).
var optionName = regexp.MustCompile(`^-{0,2}[A-Za-z_][A-Za-z0-9_.-]*$`)

// isOption reports whether a is an option that may take the next argument
// as its value.
func isOption(a string) bool {
	return strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "---") && optionName.MatchString(a)
}

// programSecret is an option of a known program whose value is a secret
// although its name does not say so: glued to it (mysql -pPW, curl
// --user=bob:pw) and/or as the next argument.
type programSecret struct {
	flag                string
	glued, nextArgument bool
}

// programSecrets are the short options that carry a password for programs
// that take one on the command line. A short option glued to its value is
// only hidden for these: elsewhere -p1 or -p8080 is a port or a count.
var programSecrets = func() map[string][]programSecret {
	m := map[string][]programSecret{
		"sshpass":   {{"-p", true, true}},
		"curl":      {{"-u", true, true}, {"--user", true, true}},
		"redis-cli": {{"-a", true, true}},
	}
	// mysql -p alone asks on the terminal; its next argument is the
	// database.
	for _, p := range []string{"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck",
		"mysqlpump", "mysqlbinlog", "mysqlslap", "mariadb", "mariadb-dump", "mariadb-admin", "mariadb-import"} {
		m[p] = []programSecret{{"-p", true, false}}
	}
	return m
}()

// redactSecrets hides secrets in argv (changed in place): the values of
// secret-named options and variables, secret headers, URL credentials,
// and known programs' password options; inside an argument that holds
// white space (a shell script, a rewritten process title) the same rules
// apply to its words.
func redactSecrets(argv []string) []string { return redactArgs(argv, true) }

func redactArgs(args []string, inner bool) []string {
	var prog []programSecret
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			if p, ok := programSecrets[filepath.Base(a)]; ok {
				prog = p
				continue
			}
		}
		if n, ok := redactProgramOption(prog, args, i); ok {
			i += n
			continue
		}
		// --name=value, NAME=value.
		if name, val, ok := strings.Cut(a, "="); ok && optionName.MatchString(name) {
			if secretName(name) {
				args[i] = name + "=" + Redacted
			} else {
				args[i] = name + "=" + redactText(val, inner)
			}
			continue
		}
		// --name value. The value may start with one dash (a password
		// can); two dashes are the next option or the end of options.
		if isOption(a) && secretName(a) {
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				args[i+1] = Redacted
				i++
			}
			continue
		}
		args[i] = redactText(a, inner)
	}
	return args
}

// redactProgramOption applies a program's password options at args[i];
// n is the number of arguments it consumed beyond args[i]. A long option
// is glued with '=', a short one directly.
func redactProgramOption(prog []programSecret, args []string, i int) (n int, ok bool) {
	a := args[i]
	for _, s := range prog {
		long := strings.HasPrefix(s.flag, "--")
		switch {
		case a == s.flag && s.nextArgument:
			if i+1 < len(args) {
				args[i+1] = Redacted
				return 1, true
			}
			return 0, true
		case s.glued && long && strings.HasPrefix(a, s.flag+"="):
			args[i] = s.flag + "=" + Redacted
			return 0, true
		case s.glued && !long && len(a) > len(s.flag) && strings.HasPrefix(a, s.flag):
			args[i] = s.flag + Redacted
			return 0, true
		}
	}
	return 0, false
}

var (
	// urlUserinfo matches the user:password@ part of a URL, to the last
	// '@' before the path (a password may hold an unescaped '@').
	urlUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/\s]+@`)
	// namedValue matches NAME=VALUE and NAME: VALUE inside an argument, at
	// its start or after a separator (space, quote, brace, ',', ';', '&',
	// '?'): a header, a URL query, a connection string, JSON. An
	// authentication scheme (Bearer, Basic) before the value stays.
	namedValue = regexp.MustCompile(`(?:^|[\s"'{(,;&?])(-{0,2}["']?[A-Za-z_][A-Za-z0-9_.-]*["']?)(\s*[:=]\s*)` +
		`((?i:bearer|basic|digest|negotiate|token)\s+)?("[^"]*"|'[^']*'|[^\s,;&})"']+)`)
	// bearer matches a bearer token anywhere.
	bearer = regexp.MustCompile(`(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+`)
)

// redactText hides URL credentials, secret named values and bearer tokens
// inside one argument; words: also the words of an argument that holds
// white space, as arguments of their own.
func redactText(s string, words bool) string {
	s = urlUserinfo.ReplaceAllString(s, "${1}"+Redacted+"@")
	s = redactNamedValues(s)
	s = bearer.ReplaceAllString(s, "${1}"+Redacted)
	if words && strings.ContainsAny(s, " \t\n") {
		s = redactWords(s)
	}
	return s
}

// redactNamedValues hides the values of secret names in s. After a name
// that is not secret the search goes on from its value, which may hold
// one (--opts=extra=token=x).
func redactNamedValues(s string) string {
	var b strings.Builder
	changed := false
	pos := 0
	for pos < len(s) {
		m := namedValue.FindStringSubmatchIndex(s[pos:])
		if m == nil {
			break
		}
		for j := range m {
			if m[j] >= 0 {
				m[j] += pos
			}
		}
		name, sep, val := s[m[2]:m[3]], s[m[4]:m[5]], m[8]
		if !secretName(strings.Trim(name, `"'`)) {
			b.WriteString(s[pos:val])
			pos = val
			continue
		}
		vend := m[9]
		if m[2] == 0 && strings.Contains(sep, ":") {
			// A header (curl -H "Cookie: a=1; b=2"): all of the rest.
			vend = len(s)
		}
		changed = true
		b.WriteString(s[pos:val])
		if q := s[val]; q == '"' || q == '\'' {
			b.WriteString(string(q) + Redacted + string(q))
		} else {
			b.WriteString(Redacted)
		}
		pos = vend
	}
	if !changed {
		return s
	}
	b.WriteString(s[pos:])
	return b.String()
}

// redactWords applies the argument rules to the words of s, keeping the
// white space between them. Quotes are not parsed: in a script
// --password 'two words' hides only the first.
func redactWords(s string) string {
	var ws, gaps []string
	for rest := s; rest != ""; {
		i := strings.IndexFunc(rest, unicode.IsSpace)
		if i < 0 {
			ws, rest = append(ws, rest), ""
			break
		}
		j := strings.IndexFunc(rest[i:], func(r rune) bool { return !unicode.IsSpace(r) })
		if j < 0 {
			j = len(rest) - i
		}
		ws, gaps, rest = append(ws, rest[:i]), append(gaps, rest[i:i+j]), rest[i+j:]
	}
	redactArgs(ws, false)
	var b strings.Builder
	for i, w := range ws {
		b.WriteString(w)
		if i < len(gaps) {
			b.WriteString(gaps[i])
		}
	}
	return b.String()
}

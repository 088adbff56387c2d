package otel

import (
	"net/url"
	"strings"
)

// RedactURL returns an endpoint for logs and summaries: without the
// user:password@ part and the query, either of which may carry a
// credential. A string that does not parse as a URL is returned as
// "(unparsable URL)" rather than echoed.
func RedactURL(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.Opaque != "" {
		// host:port parses as scheme "host"; user:pass@host:port too.
		if i := strings.LastIndexByte(s, '@'); i >= 0 {
			return s[i+1:]
		}
		return s
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

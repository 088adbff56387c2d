package otel

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// promContentType is the Prometheus text exposition format, version 0.0.4,
// which every Prometheus-compatible scraper reads.
const promContentType = "text/plain; version=0.0.4; charset=utf-8"

// promHandler serves the meter provider's current values, collected through
// reader, in the Prometheus text format. Names follow the OpenTelemetry to
// Prometheus mapping: dots become underscores, the unit is appended
// ("s" → _seconds, "1" → _ratio, {annotations} dropped), monotonic sums end in
// _total, histograms expand into _bucket/_sum/_count. The resource goes out
// once, as the labels of target_info.
type promHandler struct {
	reader *sdkmetric.ManualReader
}

func (h promHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(r.Context(), &rm); err != nil {
		http.Error(w, "collect metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", promContentType)
	// Render in memory first: writes to a strings.Builder cannot fail, so the
	// one write that can (to the scraper) is the one whose error matters.
	var b strings.Builder
	writeProm(&b, &rm)
	// A failed write means the scraper went away after the headers were sent:
	// there is no status left to answer with, and its next scrape renders afresh.
	_, _ = io.WriteString(w, b.String())
}

func writeProm(w *strings.Builder, rm *metricdata.ResourceMetrics) {
	if rm.Resource != nil && rm.Resource.Len() > 0 {
		fmt.Fprintf(w, "# HELP target_info Target metadata\n# TYPE target_info gauge\n")
		w.WriteString("target_info")
		writeLabels(w, *rm.Resource.Set(), "", "")
		w.WriteString(" 1\n")
	}
	var ms []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		ms = append(ms, sm.Metrics...)
	}
	slices.SortFunc(ms, func(a, b metricdata.Metrics) int { return cmp.Compare(a.Name, b.Name) })
	for _, m := range ms {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			writeSum(w, m, d.IsMonotonic, d.DataPoints)
		case metricdata.Sum[float64]:
			writeSum(w, m, d.IsMonotonic, d.DataPoints)
		case metricdata.Gauge[int64]:
			writePoints(w, m, promName(m.Name, m.Unit, ""), "gauge", d.DataPoints)
		case metricdata.Gauge[float64]:
			writePoints(w, m, promName(m.Name, m.Unit, ""), "gauge", d.DataPoints)
		case metricdata.Histogram[int64]:
			writeHistogram(w, m, d.DataPoints)
		case metricdata.Histogram[float64]:
			writeHistogram(w, m, d.DataPoints)
		}
	}
}

func writeSum[N int64 | float64](w *strings.Builder, m metricdata.Metrics, monotonic bool, dps []metricdata.DataPoint[N]) {
	if monotonic {
		writePoints(w, m, promName(m.Name, m.Unit, "_total"), "counter", dps)
	} else {
		writePoints(w, m, promName(m.Name, m.Unit, ""), "gauge", dps)
	}
}

func writeHeader(w *strings.Builder, name, help, typ string) {
	if help != "" {
		fmt.Fprintf(w, "# HELP %s %s\n", name, escapeHelp(help))
	}
	fmt.Fprintf(w, "# TYPE %s %s\n", name, typ)
}

func writePoints[N int64 | float64](w *strings.Builder, m metricdata.Metrics, name, typ string, dps []metricdata.DataPoint[N]) {
	if len(dps) == 0 {
		return
	}
	writeHeader(w, name, m.Description, typ)
	dps = slices.Clone(dps)
	slices.SortFunc(dps, func(a, b metricdata.DataPoint[N]) int {
		return cmp.Compare(a.Attributes.Encoded(attribute.DefaultEncoder()), b.Attributes.Encoded(attribute.DefaultEncoder()))
	})
	for _, dp := range dps {
		w.WriteString(name)
		writeLabels(w, dp.Attributes, "", "")
		w.WriteByte(' ')
		w.WriteString(formatFloat(float64(dp.Value)))
		w.WriteByte('\n')
	}
}

func writeHistogram[N int64 | float64](w *strings.Builder, m metricdata.Metrics, dps []metricdata.HistogramDataPoint[N]) {
	if len(dps) == 0 {
		return
	}
	name := promName(m.Name, m.Unit, "")
	writeHeader(w, name, m.Description, "histogram")
	dps = slices.Clone(dps)
	slices.SortFunc(dps, func(a, b metricdata.HistogramDataPoint[N]) int {
		return cmp.Compare(a.Attributes.Encoded(attribute.DefaultEncoder()), b.Attributes.Encoded(attribute.DefaultEncoder()))
	})
	for _, dp := range dps {
		var cum uint64
		for i, bound := range dp.Bounds {
			if i < len(dp.BucketCounts) {
				cum += dp.BucketCounts[i]
			}
			w.WriteString(name + "_bucket")
			writeLabels(w, dp.Attributes, "le", formatFloat(bound))
			w.WriteString(" " + strconv.FormatUint(cum, 10) + "\n")
		}
		w.WriteString(name + "_bucket")
		writeLabels(w, dp.Attributes, "le", "+Inf")
		w.WriteString(" " + strconv.FormatUint(dp.Count, 10) + "\n")
		w.WriteString(name + "_sum")
		writeLabels(w, dp.Attributes, "", "")
		w.WriteString(" " + formatFloat(float64(dp.Sum)) + "\n")
		w.WriteString(name + "_count")
		writeLabels(w, dp.Attributes, "", "")
		w.WriteString(" " + strconv.FormatUint(dp.Count, 10) + "\n")
	}
}

// writeLabels writes {k="v",...} for the set plus one extra label when
// extraKey is set; nothing when there is no label at all.
func writeLabels(w *strings.Builder, set attribute.Set, extraKey, extraVal string) {
	if set.Len() == 0 && extraKey == "" {
		return
	}
	w.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			w.WriteByte(',')
		}
		first = false
	}
	it := set.Iter()
	for it.Next() {
		kv := it.Attribute()
		sep()
		w.WriteString(promLabel(string(kv.Key)))
		w.WriteString(`="`)
		w.WriteString(escapeLabel(kv.Value.String()))
		w.WriteByte('"')
	}
	if extraKey != "" {
		sep()
		w.WriteString(extraKey + `="` + escapeLabel(extraVal) + `"`)
	}
	w.WriteByte('}')
}

// promUnits maps the UCUM units gaptrace uses to Prometheus base-unit words.
var promUnits = map[string]string{
	"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
	"By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
	"1": "ratio", "%": "percent", "Hz": "hertz", "W": "watts", "Cel": "celsius",
}

// promName turns an OpenTelemetry name and unit into a Prometheus metric
// name: gaptrace.gpu.idle + "s" + counter → gaptrace_gpu_idle_seconds_total.
// A unit word the name already ends with is not repeated.
func promName(name, unit, suffix string) string {
	n := sanitize(name, false)
	if word := unitWord(unit); word != "" && !strings.HasSuffix(n, "_"+word) {
		n += "_" + word
	}
	if suffix != "" && !strings.HasSuffix(n, suffix) {
		n += suffix
	}
	return n
}

func unitWord(unit string) string {
	if unit == "" || strings.HasPrefix(unit, "{") {
		return "" // {step}, {event}: annotations, not units
	}
	if w, ok := promUnits[unit]; ok {
		return w
	}
	if per, under, ok := strings.Cut(unit, "/"); ok {
		a, b := unitWord(per), unitWord(under)
		if b == "" {
			b = sanitize(under, true)
		}
		if a == "" {
			a = sanitize(per, true)
		}
		return a + "_per_" + b
	}
	return sanitize(unit, true)
}

func promLabel(key string) string { return sanitize(key, true) }

// sanitize keeps [a-zA-Z0-9_] (and ':' in metric names), turns anything
// else into '_', and prefixes a leading digit with '_'.
func sanitize(s string, label bool) string {
	var b strings.Builder
	for i, r := range s {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9' && i > 0) || (r == ':' && !label)
		switch {
		case ok:
			b.WriteRune(r)
		case r >= '0' && r <= '9':
			b.WriteString("_" + string(r))
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

// The exposition is UTF-8 (promContentType): a scraper rejects a label
// value that is not.
func escapeLabel(s string) string { return labelEscaper.Replace(ValidUTF8(s)) }
func escapeHelp(s string) string  { return helpEscaper.Replace(ValidUTF8(s)) }

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Bounds of the Prometheus endpoint: a scraper needs one connection every
// few seconds, so anything beyond these is someone else's.
const (
	promMaxConns      = 32
	promReadTimeout   = 10 * time.Second // a whole request, headers and body
	promWriteTimeout  = 10 * time.Second
	promIdleTimeout   = 30 * time.Second // a kept-alive connection between scrapes
	promMaxHeaderSize = 8 << 10
)

// newPromServer serves reader's metrics at /metrics on ln, within the
// bounds above: connections past promMaxConns are closed at once, so that
// idle ones never exhaust this process's file descriptors (which the
// tracer needs to read the job's /proc).
func newPromServer(ln net.Listener, reader *sdkmetric.ManualReader) (*http.Server, net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promHandler{reader: reader})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: promReadTimeout,
		WriteTimeout: promWriteTimeout, IdleTimeout: promIdleTimeout, MaxHeaderBytes: promMaxHeaderSize}
	return srv, &capListener{Listener: ln, max: promMaxConns}
}

// capListener closes connections accepted past max open ones.
type capListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Uint64
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			c.Close()
			continue
		}
		return &capConn{Conn: c, l: l}, nil
	}
}

// capConn gives its slot back once, when closed.
type capConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

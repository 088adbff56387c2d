// Command fleet measures one gaptrace gateway under many sidecars: it
// replays a recorded run (correlate/testdata/recordings) through
// gaptrace's exporter once per rank, as the sidecars of one job would
// export it (shared step trace IDs, one "rank N" span per rank, 8 ranks a
// node), then sends those spans from N concurrent OTLP/gRPC clients into a
// gateway (build/otelcol with deploy/otel-collector/config.yaml) that
// exports to a counting OTLP sink. It reports spans/s per gateway CPU
// core, the gateway's memory, what the gateway refused or dropped, and how
// many spans and step traces sampling kept.
//
//	go run ./test/fleet -sidecars 16 -rate 20000 -duration 60s
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	collpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/gaptrace/gaptrace/internal/testutil"
	"github.com/gaptrace/gaptrace/test/fleet/gateway"
)

type options struct {
	otelcol, rec  string
	sidecars      int
	perNode       int
	rate          float64 // spans/s from all sidecars together
	duration      time.Duration
	samplePercent float64
	keepGapMS     int
	decisionWait  time.Duration
	batch         int
	log           func(format string, a ...any)
}

// report is what one run measured.
type report struct {
	Sidecars       int     `json:"sidecars"`
	Passes         int     `json:"passes"`
	SpansSent      int64   `json:"spans_sent"`
	TracesSent     int64   `json:"traces_sent"`
	SendSeconds    float64 `json:"send_seconds"`
	SpansPerSecond float64 `json:"spans_per_second"`
	// The gateway's own counters.
	Accepted     float64            `json:"accepted_spans"`
	Drops        map[string]float64 `json:"drops"`
	SampledByPol map[string]float64 `json:"traces_sampled_by_policy"`
	TailSampling map[string]float64 `json:"tail_sampling"`
	// The gateway's CPU over the whole run, per span.
	GatewayCPUSeconds float64 `json:"gateway_cpu_seconds"`
	SpansPerCoreSec   float64 `json:"spans_per_core_second"`
	PeakRSSMiB        float64 `json:"peak_rss_mib"`
	// What reached the trace backend.
	SinkSpans      int64   `json:"kept_spans"`
	SinkTraces     int     `json:"kept_traces"`
	KeptSpanRatio  float64 `json:"kept_span_ratio"`
	KeptTraceRatio float64 `json:"kept_trace_ratio"`
	ClientErrors   int64   `json:"client_errors"`
	// The recorded run as the sidecars export it.
	SpansPerStepPerRank float64 `json:"spans_per_step_per_rank"`
	OTLPBytesPerSpan    float64 `json:"otlp_bytes_per_span"`
}

// dropped is everything the gateway lost or refused.
func (r report) dropped() float64 {
	total := float64(r.ClientErrors)
	for _, v := range r.Drops {
		total += v
	}
	return total
}

func main() {
	root, _ := testutil.RepoRoot()
	o := options{log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }}
	flag.StringVar(&o.otelcol, "otelcol", root+"/build/otelcol", "gateway binary (make otelcol)")
	flag.StringVar(&o.rec, "rec", root+"/correlate/testdata/recordings/h100-accum-full.rec.gz", "recording to replay")
	flag.IntVar(&o.sidecars, "sidecars", 16, "concurrent sidecars (ranks of one job)")
	flag.IntVar(&o.perNode, "ranks-per-node", 8, "ranks per node (host.name)")
	flag.Float64Var(&o.rate, "rate", 20000, "spans/s from all sidecars together (0: as fast as accepted)")
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "how long to send (whole passes over the recording)")
	flag.Float64Var(&o.samplePercent, "sample", 10, "SAMPLE_PERCENT: ordinary step traces kept")
	flag.IntVar(&o.keepGapMS, "keep-gap-ms", 100, "KEEP_GAP_MS: a step with a gap this long is kept")
	flag.DurationVar(&o.decisionWait, "decision-wait", 5*time.Second, "DECISION_WAIT")
	flag.IntVar(&o.batch, "batch", 512, "spans per OTLP request")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	flag.Parse()
	r, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
	if *asJSON {
		b, _ := json.MarshalIndent(r, "", "  ")
		fmt.Println(string(b))
		return
	}
	fmt.Printf("%d sidecars, %d passes: %d spans, %d step traces sent in %.1f s (%.0f spans/s)\n",
		r.Sidecars, r.Passes, r.SpansSent, r.TracesSent, r.SendSeconds, r.SpansPerSecond)
	fmt.Printf("recording: %.1f spans per step per rank, %.0f OTLP bytes per span\n", r.SpansPerStepPerRank, r.OTLPBytesPerSpan)
	fmt.Printf("gateway: %.0f accepted, %.1f CPU-s: %.0f spans/s per core; peak RSS %.0f MiB\n",
		r.Accepted, r.GatewayCPUSeconds, r.SpansPerCoreSec, r.PeakRSSMiB)
	fmt.Printf("dropped: %.0f %v (client errors %d)\n", r.dropped(), r.Drops, r.ClientErrors)
	fmt.Printf("kept: %d spans (%.3f), %d of %d traces (%.3f); sampled by policy %v\n",
		r.SinkSpans, r.KeptSpanRatio, r.SinkTraces, r.TracesSent, r.KeptTraceRatio, r.SampledByPol)
	if r.dropped() != 0 {
		os.Exit(1)
	}
}

// sidecar is one rank's requests and their original trace IDs, which each
// pass over the recording changes (the same way on every rank) so that
// every pass makes new step traces.
type sidecar struct {
	reqs  []*collpb.ExportTraceServiceRequest
	orig  [][][16]byte
	spans int
	bytes int // OTLP protobuf size of one pass
	steps int
}

func (s *sidecar) setPass(pass int) {
	for i, req := range s.reqs {
		k := 0
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					// Both halves: the sampler's decision caches key
					// on the low 8 bytes.
					for _, at := range []int{0, 8} {
						binary.BigEndian.PutUint32(sp.TraceId[at:at+4], binary.BigEndian.Uint32(s.orig[i][k][at:at+4])^uint32(pass))
					}
					k++
				}
			}
		}
	}
}

func prepare(o options) ([]*sidecar, int64, error) {
	rp, err := replayRecording(o.rec)
	if err != nil {
		return nil, 0, err
	}
	dir, err := os.MkdirTemp("", "gaptrace-fleet-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	traces := map[string]bool{}
	var out []*sidecar
	for rank := range o.sidecars {
		spans, err := sidecarSpans(rp, dir, "fleet-job", rank, o.perNode)
		if err != nil {
			return nil, 0, err
		}
		for _, s := range spans {
			traces[s.TraceID] = true
		}
		reqs, err := batches(spans, o.batch)
		if err != nil {
			return nil, 0, err
		}
		sc := &sidecar{reqs: reqs, spans: len(spans), steps: len(rp.steps)}
		for _, req := range reqs {
			sc.bytes += proto.Size(req)
			var ids [][16]byte
			for _, sp := range req.ResourceSpans[0].ScopeSpans[0].Spans {
				var id [16]byte
				copy(id[:], sp.TraceId)
				ids = append(ids, id)
			}
			sc.orig = append(sc.orig, ids)
		}
		out = append(out, sc)
	}
	return out, int64(len(traces)), nil
}

func run(o options) (report, error) {
	if o.sidecars < 1 || o.perNode < 1 || o.batch < 1 || o.rate < 0 {
		return report{}, errors.New("sidecars, ranks-per-node and batch must be >= 1, rate >= 0")
	}
	sidecars, tracesPerPass, err := prepare(o)
	if err != nil {
		return report{}, err
	}
	perPass, bytes := 0, 0
	for _, s := range sidecars {
		perPass, bytes = perPass+s.spans, bytes+s.bytes
	}
	passes := 1
	if o.rate > 0 {
		passes = max(1, int(o.duration.Seconds()*o.rate/float64(perPass)+0.5))
	}
	o.log("%d sidecars, %d spans and %d step traces a pass, %d passes", len(sidecars), perPass, tracesPerPass, passes)

	sk, err := newSink()
	if err != nil {
		return report{}, err
	}
	defer sk.stop()
	g, err := gateway.Start(o.otelcol, gateway.Options{TracesEndpoint: sk.addr(), SamplePercent: o.samplePercent,
		KeepGapMS: o.keepGapMS, DecisionWait: o.decisionWait}, 60*time.Second)
	if err != nil {
		return report{}, err
	}
	defer g.Stop()
	cpu0, err := cpuSeconds(g.PID())
	if err != nil {
		return report{}, err
	}

	r := report{Sidecars: len(sidecars), Passes: passes, TracesSent: tracesPerPass * int64(passes),
		SpansPerStepPerRank: float64(perPass) / float64(len(sidecars)*sidecars[0].steps),
		OTLPBytesPerSpan:    float64(bytes) / float64(perPass)}
	var sent, clientErrs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, sc := range sidecars {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, errs := send(g.OTLPGRPCEndpoint(), sc, passes, o.rate/float64(len(sidecars)))
			sent.Add(n)
			clientErrs.Add(errs)
		}()
	}
	wg.Wait()
	r.SendSeconds = time.Since(start).Seconds()
	r.SpansSent, r.ClientErrors = sent.Load(), clientErrs.Load()
	r.SpansPerSecond = float64(r.SpansSent) / r.SendSeconds

	// Every accepted span is decided after DECISION_WAIT; wait until the
	// sink has been still for two of them.
	last, still := int64(-1), time.Now()
	for time.Since(still) < 2*o.decisionWait+2*time.Second {
		if n, _ := sk.counts(); n != last {
			last, still = n, time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
	cpu1, err := cpuSeconds(g.PID())
	if err != nil {
		return report{}, err
	}
	r.GatewayCPUSeconds = cpu1 - cpu0
	r.PeakRSSMiB, err = peakRSSMiB(g.PID())
	if err != nil {
		return report{}, err
	}
	tel, err := gateway.Scrape(g.TelemetryURL())
	if err != nil {
		return report{}, err
	}
	r.Drops, r.SampledByPol, r.TailSampling = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, s := range tel {
		switch name := strings.TrimSuffix(s.Name, "_total"); {
		case strings.HasSuffix(name, "receiver_accepted_spans"):
			r.Accepted += s.Value
		case strings.HasSuffix(name, "refused_spans"), strings.HasSuffix(name, "send_failed_spans"),
			strings.HasSuffix(name, "enqueue_failed_spans"), strings.HasSuffix(name, "dropped_too_early"),
			strings.HasSuffix(name, "failed_log_records"), strings.HasSuffix(name, "refused_metric_points"),
			strings.HasSuffix(name, "send_failed_metric_points"):
			r.Drops[strings.TrimPrefix(name, "otelcol_")] += s.Value
		case strings.HasSuffix(name, "tail_sampling_count_traces_sampled") && s.Labels["sampled"] == "true":
			r.SampledByPol[s.Labels["policy"]] += s.Value
		}
		if i := strings.Index(s.Name, "tail_sampling_"); i >= 0 && !strings.Contains(s.Name, "_bucket") &&
			!strings.Contains(s.Name, "count_traces_sampled") && !strings.Contains(s.Name, "execution") {
			r.TailSampling[s.Name[i+len("tail_sampling_"):]+labelSuffix(s.Labels)] += s.Value
		}
	}
	r.SinkSpans, r.SinkTraces = sk.counts()
	if r.GatewayCPUSeconds > 0 {
		r.SpansPerCoreSec = r.Accepted / r.GatewayCPUSeconds
	}
	if r.SpansSent > 0 {
		r.KeptSpanRatio = float64(r.SinkSpans) / float64(r.SpansSent)
	}
	if r.TracesSent > 0 {
		r.KeptTraceRatio = float64(r.SinkTraces) / float64(r.TracesSent)
	}
	return r, nil
}

// send replays one sidecar's requests passes times at rate spans/s (0:
// back to back) and returns the spans the gateway accepted and the
// requests it failed.
func send(endpoint string, sc *sidecar, passes int, rate float64) (int64, int64) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, int64(passes * len(sc.reqs))
	}
	defer conn.Close()
	client := collpb.NewTraceServiceClient(conn)
	var sent, errs int64
	start := time.Now()
	for pass := range passes {
		sc.setPass(pass)
		for i, req := range sc.reqs {
			if rate > 0 {
				due := start.Add(time.Duration(float64(sent) / rate * float64(time.Second)))
				time.Sleep(time.Until(due))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := client.Export(ctx, req)
			cancel()
			if err != nil {
				errs++
				continue
			}
			sent += int64(len(sc.orig[i]))
		}
	}
	return sent, errs
}

// cpuSeconds is a process's user + system CPU time.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (ut + st) / 100, nil // USER_HZ
}

// peakRSSMiB is a process's peak resident memory (VmHWM).
func peakRSSMiB(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// labelSuffix names a series' sampling labels, if any.
func labelSuffix(l map[string]string) string {
	out := ""
	for _, k := range []string{"sampled", "decision"} {
		if v, ok := l[k]; ok {
			out += "{" + k + "=" + v + "}"
		}
	}
	return out
}

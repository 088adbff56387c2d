package main

import (
	"errors"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/internal/testutil"
	"github.com/gaptrace/gaptrace/test/fleet/gateway"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// TestFleetSixteenSidecars: 16 sidecars of one job (two nodes) replay a
// recorded run into one gateway. Kept whole, every span and step trace
// reaches the backend and nothing is refused or dropped; at 0 % for
// ordinary steps, only the long-gap policy keeps traces.
func TestFleetSixteenSidecars(t *testing.T) {
	testutil.SkipShort(t, "the gateway")
	bin, err := gateway.Binary()
	if errors.Is(err, gateway.ErrNoBinary) {
		t.Skipf("%v (make test does both)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	o := options{otelcol: bin, rec: root + "/correlate/testdata/recordings/h200-acc-lite.rec.gz", sidecars: 16, perNode: 8,
		rate: 4000, duration: 2 * time.Second, keepGapMS: 100, decisionWait: time.Second, batch: 256, log: t.Logf}
	for _, pct := range []float64{100, 0} {
		o.samplePercent = pct
		r, err := run(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("sample %v%%: %+v", pct, r)
		if r.dropped() != 0 || r.Accepted != float64(r.SpansSent) || r.SpansSent == 0 {
			t.Errorf("sample %v%%: %d spans sent, %.0f accepted, dropped %v, client errors %d", pct, r.SpansSent, r.Accepted, r.Drops, r.ClientErrors)
		}
		switch pct {
		case 100:
			if r.SinkSpans != r.SpansSent || int64(r.SinkTraces) != r.TracesSent {
				t.Errorf("all kept: backend got %d spans of %d, %d traces of %d", r.SinkSpans, r.SpansSent, r.SinkTraces, r.TracesSent)
			}
		case 0:
			if r.SinkTraces == 0 || int64(r.SinkTraces) >= r.TracesSent || r.SampledByPol["ordinary-steps"] != 0 ||
				r.SampledByPol["long-gap"] != float64(r.SinkTraces) {
				t.Errorf("ordinary steps at 0%%: %d of %d traces kept, by policy %v", r.SinkTraces, r.TracesSent, r.SampledByPol)
			}
		}
	}
}

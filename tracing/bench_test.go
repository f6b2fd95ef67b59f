package tracing

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/internal/stepbench"
)

// BenchmarkEngineSteps is stepbench's engine step in its steady state (256 requests
// decoding, one arriving every other step: about 2.5 spans a step), with tracing off, on
// with an exporter that discards the spans (what tracing costs kvtop), and on with OTLP/HTTP
// to a receiver on loopback that discards them (the whole pipeline, the receiver's reading
// included, on the same cores). Each case runs alone, to profile one (-cpuprofile,
// -memprofile); internal/stepbench's BenchmarkEngineSteps interleaves them with KV events,
// for the comparison.
func BenchmarkEngineSteps(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  func(b *testing.B) (Config, bool)
	}{
		{"tracing=off", func(*testing.B) (Config, bool) { return Config{}, false }},
		{"tracing=discard", func(*testing.B) (Config, bool) { return Config{Exporter: tracetest.NewNoopExporter()}, true }},
		{"tracing=otlp", func(b *testing.B) (Config, bool) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/x-protobuf")
			}))
			b.Cleanup(srv.Close)
			return Config{Endpoint: srv.URL}, true
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg, on := c.cfg(b)
			if !on {
				stepbench.Run(b, nil)
				return
			}
			t, err := Start(cfg)
			if err != nil {
				b.Fatal(err)
			}
			stepbench.Run(b, func(e *engine.Engine, evs []engine.Event) { t.Observe(e, evs) })
			t.Close()
			if st := t.Stats(); st.DroppedEvents > 0 || st.ExportFailures > 0 {
				b.Logf("%+v", st)
			}
			b.ReportMetric(float64(t.Stats().Spans)/float64(b.N), "spans/op")
		})
	}
}

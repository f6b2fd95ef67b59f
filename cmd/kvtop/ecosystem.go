package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/kvevents"
	"github.com/kvtop/kvtop/tracing"
	"github.com/kvtop/kvtop/wire"
)

// ecoOptions are serve's flags for the systems around a decode instance: KV events for
// KV-aware routers and request traces for a tracing backend. Everything is off unless its
// flag is given.
type ecoOptions struct {
	kvEvents   string // PUB endpoint, tcp://HOST:PORT
	kvReplay   string // ROUTER endpoint for replay
	kvBuffer   int
	kvEncoding kvevents.Encoding
	kvTopic    string
	kvDial     bool
	kvRemote   bool
	otlp       string  // OTLP/HTTP traces URL
	otlpSample float64 // the fraction of requests without a traceparent traced
}

// ecoBounds are the ranges of the ecosystem flags.
var ecoBounds = map[string]bound{
	"kv-events-buffer": ints(1, 1<<20),
	"otlp-sample":      floats(0, 1, false),
}

// ecoKind says which command the ecosystem flags are for.
type ecoKind int

const (
	ecoServe ecoKind = iota // one decode instance: KV events and request traces
	ecoTap                  // a tap's decode instances: KV events, a topic each
)

// tapTopic is the default topic of a tap's KV events: {instance} is the decode instance's
// host:port, as llm-d's topics (kv@POD@MODEL) name a pod.
const tapTopic = "kv@{instance}"

// ecoFlags registers the ecosystem flags on fs and returns the function that checks them.
func ecoFlags(fs *flag.FlagSet, kind ecoKind) func() (ecoOptions, error) {
	kvWhat := "publish the prefix cache's blocks as vLLM's KV events on a ZMQ PUB socket listening at tcp://HOST:PORT (what Dynamo's and llm-d's indexers read); off by default"
	topicDefault, topicWhat := "", "with --kv-events: the topic of every message"
	if kind == ecoTap {
		kvWhat = "publish each decode instance's prefix-cache blocks, as its shadow holds them, as vLLM's KV events on a ZMQ PUB socket at tcp://HOST:PORT, a topic and a sequence an instance (what llm-d's indexer reads); off by default"
		topicDefault, topicWhat = tapTopic, "with --kv-events: the topic of an instance's messages; {instance} is its HOST:PORT (llm-d reads kv@POD@MODEL: e.g. 'kv@{instance}@Llama-3-8B')"
	}
	kv := fs.String("kv-events", "", kvWhat)
	replay := fs.String("kv-events-replay", "", "with --kv-events: a ZMQ ROUTER socket at tcp://HOST:PORT that replays kept batches from a sequence number")
	buffer := fs.Int("kv-events-buffer", 10_000, "with --kv-events: the last batches kept for replay")
	enc := fs.String("kv-events-encoding", "map", "with --kv-events: events as tagged maps (map, vLLM's current encoding) or tagged arrays (array, the older one)")
	topic := fs.String("kv-events-topic", topicDefault, topicWhat)
	dial := fs.Bool("kv-events-dial", false, "with --kv-events: connect the PUB socket to a subscriber that listens (llm-d's indexer) instead of listening")
	remote := fs.Bool("kv-events-remote", false, "with --kv-events: allow a non-loopback address; the events carry prompt token ids and ZMQ has no authentication here")
	otlp, sample := new(string), new(float64)
	*sample = 1
	if kind == ecoServe {
		fs.StringVar(otlp, "otlp-endpoint", "", "export a trace of every request's lifecycle over OTLP/HTTP to this URL, http(s)://HOST:PORT[/PATH] (/v1/traces if no path: a Collector, Jaeger or Tempo); off by default")
		fs.Float64Var(sample, "otlp-sample", 1, "with --otlp-endpoint: the fraction of requests traced among those without a traceparent (a traceparent's sampled flag decides for the others)")
	}
	return func() (ecoOptions, error) {
		o := ecoOptions{kvEvents: *kv, kvReplay: *replay, kvBuffer: *buffer, kvTopic: *topic, kvDial: *dial, kvRemote: *remote,
			otlp: *otlp, otlpSample: *sample}
		var err error
		if o.otlp != "" {
			if _, err := tracing.ParseEndpoint(o.otlp); err != nil {
				return o, fmt.Errorf("--otlp-endpoint: %w", err)
			}
		}
		if o.kvEncoding, err = kvevents.ParseEncoding(*enc); err != nil {
			return o, fmt.Errorf("--kv-events-encoding: %w", err)
		}
		if kind == ecoTap && !strings.Contains(o.kvTopic, "{instance}") {
			return o, fmt.Errorf("--kv-events-topic %q: want {instance} in it: each decode instance's events need a topic of their own", o.kvTopic)
		}
		if o.kvEvents != "" {
			for _, ep := range []struct{ flag, ep string }{{"kv-events", o.kvEvents}, {"kv-events-replay", o.kvReplay}} {
				if ep.ep == "" || (ep.flag == "kv-events" && o.kvDial) {
					continue
				}
				host, err := endpointHost(ep.ep)
				if err != nil {
					return o, fmt.Errorf("--%s: %w", ep.flag, err)
				}
				if !loopback(host) && !o.kvRemote {
					return o, fmt.Errorf("--%s %s is not a loopback address: the events carry prompt token ids and ZMQ has no authentication here; pass --kv-events-remote to publish there anyway", ep.flag, ep.ep)
				}
			}
		}
		return o, nil
	}
}

// endpointHost returns the host of tcp://HOST:PORT.
func endpointHost(ep string) (string, error) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: want tcp://HOST:PORT", ep)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: %v", ep, err)
	}
	return host, nil
}

// ecosystem is what the ecosystem flags started: the observers the runner must call, the
// collectors /metrics must add, and what to close once the runner has stopped.
type ecosystem struct {
	observers  []runner.Observer
	collectors []prometheus.Collector
	closers    []func() error
	kv         *kvevents.Publisher
	tracer     *tracing.Tracer
	otlpURL    string
}

// startKVEvents starts the KV-event publisher when --kv-events is given.
func (eco *ecosystem) startKVEvents(o ecoOptions, logf func(string, ...any)) error {
	if o.kvEvents == "" {
		return nil
	}
	p, err := kvevents.Start(kvevents.Config{Endpoint: o.kvEvents, Dial: o.kvDial, ReplayEndpoint: o.kvReplay,
		Buffer: o.kvBuffer, Topic: o.kvTopic, Encoding: o.kvEncoding, Logf: logf})
	if err != nil {
		return err
	}
	eco.kv = p
	eco.observers = append(eco.observers, p)
	eco.closers = append(eco.closers, p.Close)
	eco.collectors = append(eco.collectors, kvCollectors(p.Stats)...)
	return nil
}

// kvCollectors are the metrics of a KV-event publisher, or of one of its streams.
func kvCollectors(stats func() kvevents.Stats) []prometheus.Collector {
	type st = kvevents.Stats
	return statCollectors(stats,
		counter("kvtop_kv_events_batches_total", "KV event batches sent on the PUB socket.",
			func(s st) uint64 { return s.Batches }),
		counter("kvtop_kv_events_dropped_batches_total", "Engine calls and steps whose KV events were dropped because the sender fell behind the engine (each loss is followed by a resync).",
			func(s st) uint64 { return s.Dropped }),
		counter("kvtop_kv_events_resyncs_total", "KV event batches that started subscribers over (AllBlocksCleared, then every block) after a drop.",
			func(s st) uint64 { return s.Resyncs }),
		counter("kvtop_kv_events_replays_total", "Replay requests answered.",
			func(s st) uint64 { return s.Replays }),
		gauge("kvtop_kv_event_blocks", "Blocks (full pages of cached sequences) the KV events say the prefix cache holds.",
			func(s st) int64 { return s.Blocks }),
	)
}

// statMetric is one counter or gauge of an exporter's Stats, read at each scrape.
type statMetric[S any] struct {
	name, help string
	gauge      bool
	value      func(S) float64
}

func counter[S any](name, help string, f func(S) uint64) statMetric[S] {
	return statMetric[S]{name: name, help: help, value: func(s S) float64 { return float64(f(s)) }}
}

func gauge[S any](name, help string, f func(S) int64) statMetric[S] {
	return statMetric[S]{name: name, help: help, gauge: true, value: func(s S) float64 { return float64(f(s)) }}
}

// statCollectors makes the collectors of ms, each reading stats when scraped.
func statCollectors[S any](stats func() S, ms ...statMetric[S]) []prometheus.Collector {
	out := make([]prometheus.Collector, len(ms))
	for i, m := range ms {
		read := func() float64 { return m.value(stats()) }
		if m.gauge {
			out[i] = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: m.name, Help: m.help}, read)
		} else {
			out[i] = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help}, read)
		}
	}
	return out
}

// startTracing starts the request tracer when --otlp-endpoint is given. Export failures
// are logged whatever --verbose says: without them a tracing backend that is down is
// silence.
func (eco *ecosystem) startTracing(o ecoOptions, logf func(string, ...any)) error {
	if o.otlp == "" {
		return nil
	}
	t, err := tracing.Start(tracing.Config{Endpoint: o.otlp, Version: version, Logf: logf,
		Sampler: sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.otlpSample))})
	if err != nil {
		return err
	}
	eco.tracer = t
	eco.otlpURL, _ = tracing.ParseEndpoint(o.otlp)
	eco.observers = append(eco.observers, t)
	eco.closers = append(eco.closers, t.Close)
	type st = tracing.Stats
	eco.collectors = append(eco.collectors, statCollectors(t.Stats,
		counter("kvtop_trace_spans_total", "Request trace spans ended and handed to the OTLP exporter.",
			func(s st) uint64 { return s.Spans }),
		counter("kvtop_trace_exported_spans_total", "Request trace spans the OTLP endpoint accepted.",
			func(s st) uint64 { return s.Exported }),
		counter("kvtop_trace_export_failures_total", "OTLP exports that failed; their spans are lost.",
			func(s st) uint64 { return s.ExportFailures }),
		counter("kvtop_trace_dropped_events_total", "Engine events dropped because the span builder fell behind the engine (each loss ends the open spans as lost).",
			func(s st) uint64 { return s.DroppedEvents }),
		counter("kvtop_trace_losses_total", "Losses of engine events, after each of which the spans open were ended with outcome lost.",
			func(s st) uint64 { return s.Lost }),
		gauge("kvtop_trace_open_requests", "Requests whose trace spans are open.",
			func(s st) int64 { return s.Open }),
	)...)
	return nil
}

// start starts what o asks for.
func (eco *ecosystem) start(o ecoOptions, stderr io.Writer, verbose bool) error {
	var logf func(string, ...any)
	logger := log.New(stderr, "kvtop serve: ", log.LstdFlags)
	if verbose {
		logf = logger.Printf
	}
	if err := eco.startKVEvents(o, logf); err != nil {
		return err
	}
	if err := eco.startTracing(o, logger.Printf); err != nil {
		eco.close()
		return err
	}
	return nil
}

// wire adds to the server's options what the ecosystem needs of it: the tracer takes
// prep_recv's traceparent.
func (eco *ecosystem) wire(opts *wire.Options) {
	if eco.tracer != nil {
		opts.PrepRecvTrace = eco.tracer.Remote
	}
}

// describe says where what was started can be reached.
func (eco *ecosystem) describe(w io.Writer) {
	if p := eco.kv; p != nil {
		if a := p.Addr(); a != nil {
			fmt.Fprintf(w, "  kv events: tcp://%s", a)
		} else {
			fmt.Fprintf(w, "  kv events: sent to the subscriber")
		}
		if a := p.ReplayAddr(); a != nil {
			fmt.Fprintf(w, " (replay tcp://%s)", a)
		}
		fmt.Fprintln(w)
	}
	if eco.tracer != nil {
		fmt.Fprintf(w, "  request traces: OTLP/HTTP to %s\n", eco.otlpURL)
	}
}

// close closes what was started, in reverse order.
func (eco *ecosystem) close() error {
	var errs []error
	for i := len(eco.closers) - 1; i >= 0; i-- {
		errs = append(errs, eco.closers[i]())
	}
	return errors.Join(errs...)
}

const kvEventsUsage = `Usage: kvtop kv-events [flags] tcp://HOST:PORT

Subscribes to a vLLM-format KV-event publisher (vLLM, SGLang, TensorRT-LLM, or
'kvtop serve --kv-events') and prints every event as a JSON line, with the batch's
topic, sequence number, time and data-parallel rank. Each topic's sequence is followed on
its own. With --replay, gaps in a sequence are filled from the publisher's replay socket;
what it no longer keeps is printed as {"seq": N, "missing": M}. For 'kvtop tap
--kv-events', whose topics are its decode instances, add --replay-by-topic.

Flags:
`

func kvEventsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvtop kv-events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, kvEventsUsage)
		fs.PrintDefaults()
	}
	replay := fs.String("replay", "", "the publisher's replay socket, tcp://HOST:PORT")
	topic := fs.String("topic", "", "the topic to subscribe to (default all)")
	fromStart := fs.Bool("from-start", false, "with --replay: first print every batch the publisher still keeps")
	byTopic := fs.Bool("replay-by-topic", false, "with --replay: name the topic in replay requests, as kvtop tap's publisher of one stream an instance needs (vLLM's takes none)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "kvtop kv-events: want one endpoint, tcp://HOST:PORT")
		fs.Usage()
		return 2
	}
	if (*fromStart || *byTopic) && *replay == "" {
		fmt.Fprintln(stderr, "kvtop kv-events: --from-start and --replay-by-topic need --replay")
		return 2
	}
	for _, ep := range []string{fs.Arg(0), *replay} {
		if ep == "" {
			continue
		}
		if _, err := endpointHost(ep); err != nil {
			fmt.Fprintf(stderr, "kvtop kv-events: %v\n", err)
			return 2
		}
	}
	enc := json.NewEncoder(stdout)
	err := kvevents.Subscribe(ctx, kvevents.SubscriberConfig{Endpoint: fs.Arg(0), ReplayEndpoint: *replay, Topic: *topic, FromStart: *fromStart, ReplayByTopic: *byTopic},
		func(m kvevents.Message) error {
			for _, line := range eventLines(m) {
				if err := enc.Encode(line); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		fmt.Fprintf(stderr, "kvtop kv-events: %v\n", err)
		return 1
	}
	return 0
}

// eventLines turns a message into the JSON lines kv-events prints: one an event.
func eventLines(m kvevents.Message) []map[string]any {
	head := func() map[string]any {
		l := map[string]any{"seq": m.Seq}
		if m.Topic != "" {
			l["topic"] = m.Topic
		}
		return l
	}
	switch {
	case m.Missing > 0:
		l := head()
		l["missing"] = m.Missing
		return []map[string]any{l}
	case m.Err != nil:
		l := head()
		l["error"] = m.Err.Error()
		return []map[string]any{l}
	}
	var out []map[string]any
	for _, ev := range m.Batch.Events {
		l := head()
		l["ts"] = m.Batch.TS
		if m.Batch.HasDPRank {
			l["dp_rank"] = m.Batch.DPRank
		}
		if m.Replayed {
			l["replayed"] = true
		}
		// The event's own fields, by their vLLM names; numbers as written (a 64-bit hash
		// does not fit a float).
		if raw, err := json.Marshal(ev); err == nil {
			d := json.NewDecoder(bytes.NewReader(raw))
			d.UseNumber()
			_ = d.Decode(&l)
		}
		l["type"] = ev.Type()
		out = append(out, l)
	}
	return out
}

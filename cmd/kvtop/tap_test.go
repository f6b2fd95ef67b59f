package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/kvevents"
)

// Bad flags are refused with exit status 2 and a message that names the flag.
func TestTapRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:7071"}, "not a loopback address"},
		{[]string{"--listen", "nonsense"}, "--listen"},
		{[]string{"--upstream", "ftp://x"}, "--upstream"},
		{[]string{"--instance-config", "d1:8000"}, "HOST:PORT=FLAGS"},
		{[]string{"--instance-config", "d1=--watermark 3"}, "not HOST:PORT"},
		{[]string{"--instance-config", "d1:8000=--watermark -3"}, "--instance-config d1:8000"},
		{[]string{"--instance-config", "d1:8000=--nope"}, "--instance-config d1:8000"},
		{[]string{"--evict-order", "fifo"}, "--evict-order"},
		{[]string{"--queue", "0"}, "--queue"},
		{[]string{"--kv-events", "tcp://127.0.0.1:0", "--kv-events-topic", "kv@pod"}, "{instance}"},
		{[]string{"--kv-events", "tcp://10.0.0.1:5557"}, "--kv-events-remote"},
		{[]string{"--kv-events", "tcp://127.0.0.1:0", "--kv-events-encoding", "json"}, "--kv-events-encoding"},
		{[]string{"--otlp-endpoint", "http://127.0.0.1:4318"}, "otlp-endpoint"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		var out, errb bytes.Buffer
		code := tapCommand(context.Background(), c.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("kvtop tap %v = %d, %q; want 2 and a message with %q", c.args, code, errb.String(), c.want)
		}
	}
}

// The flags make the tap's configuration: the shared engine flags, and an instance's own
// over them; --upstream without a port gets the ports after --listen's.
func TestTapFlags(t *testing.T) {
	o, err := parseTap([]string{"--listen", "127.0.0.1:7071", "--max-total-seq-len", "65536", "--watermark", "300",
		"--upstream", "http://d0:8000", "--upstream", "127.0.0.1:9000=http://d1:8000",
		"--instance-config", "d1:8000=--max-num-seq 8 --evict-order lru"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.engine.MaxTotalSequenceLength != 65536 || o.engine.Watermark != 300 {
		t.Errorf("engine = %+v", o.engine)
	}
	d1 := o.instances["d1:8000"]
	if d1.MaxNumSequence != 8 || d1.EvictOrder.String() != "lru" || d1.MaxTotalSequenceLength != 65536 || d1.Watermark != 300 {
		t.Errorf("d1's configuration = %+v, want the shared flags with its own over them", d1)
	}
	if len(o.upstreams) != 2 || o.upstreams[0].listen != "127.0.0.1:7072" || o.upstreams[1].listen != "127.0.0.1:9000" || o.upstreams[1].url != "http://d1:8000" {
		t.Errorf("upstreams = %+v", o.upstreams)
	}
}

// serveAndTap starts a kvtop serve as D and a kvtop tap (with tapArgs) in front of it, its
// API served; both stop with the test or ctx.
func serveAndTap(t *testing.T, ctx context.Context, tapArgs ...string) (*server, *tapRun, []tapServer) {
	t.Helper()
	t.Setenv("KVTOP_TOKEN", "")
	var errb syncBuffer
	so, err := parseServe([]string{"--listen", "127.0.0.1:0", "--max-total-seq-len", "8192"}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	d, err := startServer(ctx, so, &errb)
	if err != nil {
		t.Fatal(err)
	}
	go d.Wait()
	o, err := parseTap(append([]string{"--listen", "127.0.0.1:0", "--max-total-seq-len", "8192"}, tapArgs...), &errb)
	if err != nil {
		t.Fatal(err)
	}
	tp, servers, err := startTap(o, &errb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.Close)
	go servers[0].hs.Serve(servers[0].ln)
	t.Cleanup(func() { servers[0].hs.Close() })
	return d, tp, servers
}

// The command's tap, end to end: a kvtop serve as D, a prep_recv through the tap as a
// router's HTTP proxy, and the dashboard's side of it: the tap is recognised at --attach,
// its fleet lists D, and D's shadow streams a snapshot that holds the request.
func TestTapCommandFleet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, tp, servers := serveAndTap(t, ctx)
	proxy, _ := url.Parse("http://" + servers[0].addr)
	cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	resp, err := cl.Post(d.URL()+"/microserving/prep_recv", "application/json", strings.NewReader(`{"user":"r-1","prompt":[`+strings.Repeat("5,", 39)+`5],"end":-1}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "CAAAAAAAAABbMSwwLDM5XQ==") {
		t.Fatalf("prep_recv through the tap: %s %s", resp.Status, b)
	}
	if _, ok := attachedTap(ctx, d.Addr(), ""); ok {
		t.Error("a kvtop serve was taken for a tap")
	}
	fleet, ok := attachedTap(ctx, servers[0].addr, "")
	if !ok {
		t.Fatal("the tap was not recognised at --attach")
	}
	// The shadow applies what the tap saw on its own goroutine: let it catch up first.
	if err := tp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := fleet.Rows(ctx)
	if err != nil || len(rows) != 1 || rows[0].Address != d.Addr() || rows[0].Role != "decode" || rows[0].Prepared != 1 {
		t.Fatalf("fleet rows = %+v, %v", rows, err)
	}
	src, err := fleet.Open(ctx, d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var u feed.Update
	for u.Snapshot == nil {
		select {
		case <-src.C():
		case <-time.After(10 * time.Second):
			t.Fatal("no snapshot from the shadow's stream")
		}
		u = src.Take()
	}
	if u.Snapshot == nil || len(u.Snapshot.Requests) != 1 || u.Snapshot.Requests[0].ID != "r-1" || u.Snapshot.Follow == nil {
		t.Errorf("the shadow's snapshot = %+v", u.Snapshot)
	}
}

// kvtop tap --kv-events publishes each decode instance's blocks, as its shadow holds them,
// under a topic of its own made from --kv-events-topic, with a sequence of its own and a
// replay that names the topic; the tap's /metrics counts its batches by decode_instance.
func TestTapCommandPublishesKVEventsPerInstance(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, tp, servers := serveAndTap(t, ctx, "--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0",
		"--kv-events-topic", "kv@{instance}@test-model")
	msgs := make(chan kvevents.Message, 64)
	go kvevents.Subscribe(ctx, kvevents.SubscriberConfig{Endpoint: "tcp://" + tp.kv.Addr().String(), ReplayEndpoint: "tcp://" + tp.kv.ReplayAddr().String(),
		Topic: "kv@", ReplayByTopic: true, FromStart: true}, func(m kvevents.Message) error {
		msgs <- m
		return nil
	})
	time.Sleep(200 * time.Millisecond) // let it subscribe
	proxy, _ := url.Parse("http://" + servers[0].addr)
	cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	resp, err := cl.Post(d.URL()+"/microserving/prep_recv", "application/json", strings.NewReader(`{"user":"r-1","prompt":[`+strings.Repeat("5,", 39)+`5],"end":-1}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := tp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	topic := "kv@" + d.Addr() + "@test-model"
	select {
	case m := <-msgs:
		if m.Topic != topic || m.Seq != 0 || len(m.Batch.Events) == 0 {
			t.Fatalf("the first message: %+v; want batch 0 of topic %q", m, topic)
		}
		if _, ok := m.Batch.Events[0].(kvevents.AllBlocksCleared); !ok {
			t.Errorf("the first batch's events = %+v, want AllBlocksCleared first", m.Batch.Events)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no KV events from the tap")
	}
	// kvtop kv-events, started after the traffic, prints the instance's stream from batch 0
	// by a replay that names its topic.
	subCtx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	var out, serr bytes.Buffer
	if code := kvEventsCommand(subCtx, []string{"--replay", "tcp://" + tp.kv.ReplayAddr().String(), "--from-start", "--replay-by-topic",
		"--topic", topic, "tcp://" + tp.kv.Addr().String()}, &out, &serr); code != 0 {
		t.Fatalf("kv-events = %d: %s", code, serr.String())
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.Contains(first, `"type":"AllBlocksCleared"`) || !strings.Contains(first, `"topic":"`+topic+`"`) || !strings.Contains(first, `"seq":0`) {
		t.Errorf("kv-events' first line = %s, want batch 0 of %s, AllBlocksCleared", first, topic)
	}
	mresp, err := http.Get("http://" + servers[0].addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if want := `kvtop_kv_events_batches_total{decode_instance="` + d.Addr() + `"}`; !strings.Contains(string(body), want) {
		t.Errorf("the tap's /metrics lacks %s", want)
	}
}

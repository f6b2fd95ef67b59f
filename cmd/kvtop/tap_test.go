package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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

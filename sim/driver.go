package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
)

// Calls is the decode instance as a router and a prefill instance see it. Each call returns
// at once; what the instance answers later comes back through the Driver's Admitted, Token
// and Ended.
type Calls interface {
	// PrepRecv is the router's prep_recv.
	PrepRecv(pr engine.PrepRecv) error
	// WriteKV is the prefill instance writing the KV of n tokens, starting at token offset
	// of the slots that metadata (a kv_append_metadata string) reserved.
	WriteKV(id, metadata string, offset, n int) error
	// StartGenerate is the router's start_generate.
	StartGenerate(id string, begin int) error
	// Abort is the client going away.
	Abort(id string) error
}

// Fate is what happens to a request besides the normal three calls.
type Fate uint8

// The fates.
const (
	// Normal: prep_recv, the KV, start_generate.
	Normal Fate = iota
	// Lost: the prefill instance dies after prep_recv: no KV, no start_generate. The
	// request stays prepared, holding its pages.
	Lost
	// AbortAfterPrep: the client goes away right after prep_recv answers; the prepared
	// request's KV leaks (as in MLC).
	AbortAfterPrep
)

// Arrival is a request a workload sends.
type Arrival struct {
	At        time.Duration // since the start of the run
	ID        string
	Prompt    []int32
	MaxTokens int
	Fate      Fate
	// Conv and Turn place a chat turn in its conversation (Conv -1 for none).
	Conv, Turn int
}

// Workload generates arrivals. It is deterministic for its seed and the order of what it is
// told.
type Workload interface {
	// Due returns the arrivals due by now, in order; each is returned once.
	Due(now time.Duration) []Arrival
	// Finished tells the workload a request ended with the tokens it streamed (for a
	// follow-up turn). reason is "length" for a normal finish.
	Finished(a Arrival, output []int32, reason string, now time.Duration)
}

// DriverConfig is how the router and the prefill instance behave.
type DriverConfig struct {
	// TransferRate is the prefill instance's KV write rate, in tokens per second.
	TransferRate float64
	// StartDelay is how long the router waits after the KV is in before start_generate.
	StartDelay time.Duration
	// RetryPreempted makes the router start a preempted request's three calls again.
	RetryPreempted bool
	// MaxRetries bounds the retries of one request.
	MaxRetries int
}

// Stats counts what the driver did.
type Stats struct {
	Sent        int `json:"sent"`
	Refused     int `json:"refused"` // prep_recv answered with an error
	Admitted    int `json:"admitted"`
	Finished    int `json:"finished"`
	Aborted     int `json:"aborted"`
	Preempted   int `json:"preempted"`
	Retried     int `json:"retried"`
	Lost        int `json:"lost"`
	KVTokens    int `json:"kv_tokens"`
	InFlight    int `json:"in_flight"`
	CallErrors  int `json:"call_errors"`
	PromptToks  int `json:"prompt_tokens"`
	MatchedToks int `json:"matched_tokens"`
}

type phase uint8

const (
	phaseAdmission phase = iota // prep_recv sent, waiting for the answer
	phaseTransfer               // KV being written
	phaseStart                  // KV in; start_generate due at startAt
	phaseGenerate               // streaming
	phaseLost                   // prepared and forgotten
)

// flight is one request in progress.
type flight struct {
	a        Arrival
	phase    phase
	meta     string
	end      int
	matched  int
	reserved int
	written  int
	credit   float64 // tokens the transfer may write, carried between ticks
	startAt  time.Duration
	output   []int32
	retries  int
	original string // the first id of a retried request
}

// Driver is the router and the prefill instance: a deterministic state machine ticked with
// the simulated time.
type Driver struct {
	w       Workload
	cfg     DriverConfig
	flights map[string]*flight
	order   []*flight // in flight, in sending order
	now     time.Duration
	last    time.Duration
	stats   Stats
	lastErr error
}

// NewDriver returns a driver for a workload.
func NewDriver(w Workload, cfg DriverConfig) *Driver {
	if cfg.TransferRate <= 0 {
		cfg.TransferRate = 100_000
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 3
	}
	return &Driver{w: w, cfg: cfg, flights: make(map[string]*flight)}
}

// Stats returns the counters.
func (d *Driver) Stats() Stats {
	s := d.stats
	s.InFlight = len(d.order)
	return s
}

// LastError returns the last error a call returned, if any.
func (d *Driver) LastError() error { return d.lastErr }

// Tick sends what is due by now: new requests, KV writes at the transfer rate, and
// start_generate calls.
func (d *Driver) Tick(now time.Duration, c Calls) {
	dt := now - d.last
	if dt < 0 {
		dt = 0
	}
	d.now, d.last = now, now
	for _, a := range d.w.Due(now) {
		d.send(a, "", 0, c)
	}
	for _, f := range slices.Clone(d.order) {
		switch f.phase {
		case phaseTransfer:
			f.credit += d.cfg.TransferRate * dt.Seconds()
			n := min(f.reserved-f.written, int(f.credit))
			if n <= 0 {
				continue
			}
			f.credit -= float64(n)
			if err := c.WriteKV(f.a.ID, f.meta, f.written, n); err != nil {
				d.fail(err)
				continue
			}
			f.written += n
			d.stats.KVTokens += n
			if f.written == f.reserved {
				f.phase = phaseStart
				f.startAt = now + d.cfg.StartDelay
			}
		case phaseStart:
			if now >= f.startAt {
				d.start(f, c)
			}
		}
	}
}

func (d *Driver) send(a Arrival, original string, retries int, c Calls) {
	d.stats.Sent++
	err := c.PrepRecv(engine.PrepRecv{ID: a.ID, Prompt: a.Prompt, End: -1, HasEnd: true, MaxTokens: a.MaxTokens})
	if err != nil {
		d.stats.Refused++
		d.fail(err)
		return
	}
	f := &flight{a: a, retries: retries, original: original}
	if original == "" {
		f.original = a.ID
	}
	d.flights[a.ID] = f
	d.order = append(d.order, f)
	d.stats.PromptToks += len(a.Prompt)
}

func (d *Driver) start(f *flight, c Calls) {
	if err := c.StartGenerate(f.a.ID, f.end); err != nil {
		d.fail(err)
		d.drop(f)
		return
	}
	f.phase = phaseGenerate
}

func (d *Driver) fail(err error) {
	d.stats.CallErrors++
	d.lastErr = err
}

func (d *Driver) drop(f *flight) {
	delete(d.flights, f.a.ID)
	if i := slices.Index(d.order, f); i >= 0 {
		d.order = slices.Delete(d.order, i, i+1)
	}
}

// Admitted tells the driver that prep_recv answered for a request.
func (d *Driver) Admitted(id, metadata string, promptLength, matched int, c Calls) {
	f := d.flights[id]
	if f == nil || f.phase != phaseAdmission {
		return
	}
	d.stats.Admitted++
	d.stats.MatchedToks += matched
	f.meta = metadata
	f.matched = matched
	f.end = promptLength - 1
	arr, err := prepare.Decode(metadata)
	if err == nil {
		md, _ := prepare.Split(arr)
		f.reserved = int(md.Tokens())
	} else {
		d.fail(fmt.Errorf("sim: %s: %w", id, err))
	}
	switch f.a.Fate {
	case Lost:
		f.phase = phaseLost
		d.stats.Lost++
		return
	case AbortAfterPrep:
		if err := c.Abort(id); err != nil {
			d.fail(err)
		}
		d.stats.Aborted++
		d.drop(f)
		return
	}
	if f.reserved == 0 {
		// Nothing to transfer: the router skips remote_send.
		f.phase = phaseStart
		f.startAt = d.now + d.cfg.StartDelay
		return
	}
	f.phase = phaseTransfer
}

// Failed tells the driver a call for a request failed for good (a prep_recv refused, a
// completion that broke off): the request is dropped.
func (d *Driver) Failed(id string, err error) {
	if f := d.flights[id]; f != nil {
		d.drop(f)
		d.fail(fmt.Errorf("%s: %w", id, err))
		d.w.Finished(f.a, nil, "error", d.now)
	}
}

// Token tells the driver a token of a request's completion arrived.
func (d *Driver) Token(id string, tok int32) {
	if f := d.flights[id]; f != nil {
		f.output = append(f.output, tok)
	}
}

// Ended tells the driver a request's completion ended: "length" for a normal finish, else
// the abort reason ("preempt", "abort", "reclaim").
func (d *Driver) Ended(id, reason string, c Calls) {
	f := d.flights[id]
	if f == nil {
		return
	}
	d.drop(f)
	switch reason {
	case "length":
		d.stats.Finished++
		d.w.Finished(f.a, f.output, reason, d.now)
	case engine.AbortPreempt:
		d.stats.Preempted++
		if d.cfg.RetryPreempted && f.retries < d.cfg.MaxRetries {
			d.stats.Retried++
			a := f.a
			a.ID = fmt.Sprintf("%s/retry%d", f.original, f.retries+1)
			d.send(a, f.original, f.retries+1, c)
			return
		}
		d.w.Finished(f.a, nil, reason, d.now)
	default:
		d.stats.Aborted++
		d.w.Finished(f.a, nil, reason, d.now)
	}
}

// Observe feeds the driver what an engine step (or the calls before it) produced: the
// prepare-receive answers, the streamed tokens and the ends.
func (d *Driver) Observe(evs []engine.Event, toks []engine.Token, c Calls) {
	for _, ev := range evs {
		if m, ok := ev.(engine.MetadataEmitted); ok {
			d.Admitted(m.ID, m.Encoded, m.PromptLength, m.Matched, c)
		}
	}
	for _, t := range toks {
		if t.Token >= 0 {
			d.Token(t.ID, t.Token)
		}
		if t.Final {
			d.Ended(t.ID, t.FinishReason, c)
		}
	}
}

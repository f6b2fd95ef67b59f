package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// Errors of the runner's calls.
var (
	ErrStopped = errors.New("runner: stopped")
	ErrAborted = errors.New("runner: request aborted")
	// ErrBusy refuses a prep_recv while Config.MaxWaiting others wait for admission.
	ErrBusy = errors.New("runner: too many requests waiting for admission")
)

// Config configures a Runner.
type Config struct {
	// StepsPerSec paces the steps; 0 runs them as fast as possible.
	StepsPerSec float64
	// Clock is the wall clock; the engine gets its time from it. Required.
	Clock func() time.Time
	// QueueSize bounds the calls waiting for the engine (default 1024).
	QueueSize int
	// MaxWaiting bounds the prep_recv calls waiting for admission at once; PrepRecv refuses
	// more with ErrBusy. 0 leaves them unbounded.
	MaxWaiting int
	// Backlog is how many events a subscriber may have pending before it loses them
	// (default feed.DefaultBacklog).
	Backlog int
	// StartPaused starts with the engine paused.
	StartPaused bool
	// Manual never steps the engine on its own: it changes only through calls (Do). A
	// tap's shadow engine, which steps when the decode instance it follows is seen to, runs
	// so.
	Manual bool
	// IdleTick is how often an idle engine still steps, so time-based hazards fire
	// (default 250ms).
	IdleTick time.Duration
	// SnapshotInterval spaces the snapshots the engine builds for resyncing subscribers:
	// every subscription that owes one (it lost events, or asked) waits for the next, which
	// is built once for all of them, at most once per interval (default 50ms). A new
	// subscription gets one at once. No snapshot is built while the engine has not changed
	// since the last.
	SnapshotInterval time.Duration
	// Hook, when set, runs on the engine's goroutine around every step: a workload
	// simulator uses it to make a router's calls in step with the engine.
	Hook Hook
	// Observers see the events of every call and step on the engine's goroutine, with the
	// engine, before subscribers are offered them: an exporter that needs what events do
	// not carry (the prefix cache's tokens) reads it there. An observer must return at once,
	// handing its work to a goroutine of its own through a bounded queue; it must neither
	// change the engine nor keep evs.
	Observers []Observer
}

// Observer sees every call's and step's events on the engine's goroutine (Config.Observers).
type Observer interface {
	Observe(e *engine.Engine, evs []engine.Event)
}

// Hook is called around every step, on the engine's goroutine.
type Hook interface {
	// BeforeStep may make calls on the engine; their events go out with the step's.
	BeforeStep(e *engine.Engine, now time.Time)
	// AfterStep sees the step's output. It must not keep rd's slices.
	AfterStep(e *engine.Engine, rd engine.Ready)
}

// Runner owns an engine on one goroutine.
type Runner struct {
	e   *engine.Engine
	cfg Config

	calls    chan func()
	controls chan feed.Control
	done     chan struct{}

	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	status feed.Status

	// The next shared snapshot's takers (nil while none waits), and the snapshotter's wake-up.
	snapMu   sync.Mutex
	round    *snapRound
	snapWake chan struct{}

	// Owned by the Run goroutine.
	stepBudget int
	prepWait   map[string]chan prepResult
	tokenWait  map[string]*tokenSink
	backedUp   map[string]*tokenSink // the sinks of tokenWait with tokens queued
	rateSteps  int
	rateStart  time.Time
	version    uint64           // counts the publishes that carried events
	cached     *engine.Snapshot // the last shared snapshot, of state version cachedAt
	cachedAt   uint64
}

// New returns a runner for e. Call Run to start it.
func New(e *engine.Engine, cfg Config) *Runner {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.Backlog <= 0 {
		cfg.Backlog = feed.DefaultBacklog
	}
	if cfg.IdleTick <= 0 {
		cfg.IdleTick = 250 * time.Millisecond
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = 50 * time.Millisecond
	}
	if cfg.Clock == nil {
		panic("runner: Config.Clock is required")
	}
	return &Runner{
		e:         e,
		cfg:       cfg,
		calls:     make(chan func(), cfg.QueueSize),
		controls:  make(chan feed.Control, 64),
		done:      make(chan struct{}),
		subs:      make(map[*Subscription]struct{}),
		status:    feed.Status{Paused: cfg.StartPaused, Target: cfg.StepsPerSec, Controllable: true},
		prepWait:  make(map[string]chan prepResult),
		tokenWait: make(map[string]*tokenSink),
		backedUp:  make(map[string]*tokenSink),
		snapWake:  make(chan struct{}, 1),
	}
}

// Run runs the engine until ctx is done. It returns ctx's error.
//
// Steps come at StepsPerSec (or back to back), calls are served between them, and an idle
// engine (a step that did nothing) waits for a call or the idle tick instead of spinning.
// While paused, only calls, controls and requested single steps run.
func (r *Runner) Run(ctx context.Context) error {
	defer close(r.done)
	go r.snapshots(ctx)
	r.rateStart = r.cfg.Clock()
	var interval time.Duration
	if r.cfg.StepsPerSec > 0 {
		interval = time.Duration(float64(time.Second) / r.cfg.StepsPerSec)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	last := r.cfg.Clock() // time of the last step
	idle := false
	call := func(fn func()) {
		fn()
		r.publish(r.e.TakeEvents(), r.e.TakeTokens())
		idle = false
	}
	for {
		// Wait for input until the next step is due; while paused (and no step was asked
		// for), wait for input only.
		inputOnly := (r.paused() || r.cfg.Manual) && r.stepBudget == 0
		var wait time.Duration
		if !inputOnly && r.stepBudget == 0 {
			if idle {
				wait = r.cfg.IdleTick - r.cfg.Clock().Sub(last)
			} else {
				wait = interval - r.cfg.Clock().Sub(last)
			}
		}
		if inputOnly || wait > 0 {
			var tick <-chan time.Time
			if !inputOnly {
				timer.Reset(wait)
				tick = timer.C
			}
			select {
			case <-ctx.Done():
				r.shutdown()
				return ctx.Err()
			case fn := <-r.calls:
				call(fn)
			case c := <-r.controls:
				r.control(c)
			case <-tick:
			}
			timer.Stop()
			continue
		}
		// Time to step: first serve what is queued, so calls never starve.
		for range len(r.calls) {
			call(<-r.calls)
		}
		for len(r.controls) > 0 {
			r.control(<-r.controls)
		}
		if ctx.Err() != nil {
			r.shutdown()
			return ctx.Err()
		}
		if r.paused() && r.stepBudget == 0 {
			continue
		}
		if r.stepBudget > 0 {
			r.stepBudget--
		}
		last = r.cfg.Clock()
		if r.cfg.Hook != nil {
			r.cfg.Hook.BeforeStep(r.e, last)
		}
		rd := r.e.Step(last)
		if r.cfg.Hook != nil {
			r.cfg.Hook.AfterStep(r.e, rd)
		}
		r.publish(rd.Events, rd.Tokens)
		r.measure()
		idle = rd.Action == engine.ActionIdle && r.stepBudget == 0
	}
}

func (r *Runner) paused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status.Paused
}

// measure counts a step into the rate, measured over windows of at least a second. While
// paused the rate is 0 and the window starts over: steps asked for one by one are not a
// rate, and a burst of them must not show as one.
func (r *Runner) measure() {
	now := r.cfg.Clock()
	if r.paused() {
		r.rateSteps, r.rateStart = 0, now
		return
	}
	r.rateSteps++
	if d := now.Sub(r.rateStart); d >= time.Second {
		rate := float64(r.rateSteps) / d.Seconds()
		r.rateSteps = 0
		r.rateStart = now
		r.setStatus(func(s *feed.Status) { s.Rate = rate })
	}
}

func (r *Runner) setStatus(f func(*feed.Status)) {
	r.mu.Lock()
	old := r.status
	f(&r.status)
	st := r.status
	subs := make([]*Subscription, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	r.mu.Unlock()
	if st != old {
		for _, s := range subs {
			s.mb.SetStatus(st)
		}
	}
}

func (r *Runner) control(c feed.Control) {
	switch c.Op {
	case feed.ControlPause:
		r.setStatus(func(s *feed.Status) { s.Paused, s.Rate = true, 0 })
	case feed.ControlResume:
		r.stepBudget = 0
		r.rateSteps, r.rateStart = 0, r.cfg.Clock()
		r.setStatus(func(s *feed.Status) { s.Paused = false })
	case feed.ControlStep:
		r.stepBudget += c.N
	}
}

// Control pauses, resumes or steps the engine. It does not wait for the effect.
func (r *Runner) Control(c feed.Control) error {
	if err := c.Validate(); err != nil {
		return err
	}
	switch c.Op {
	case feed.ControlSnapshot:
		return fmt.Errorf("runner: ask a subscription for a snapshot, not the runner")
	case feed.ControlSpeed, feed.ControlSeek:
		return fmt.Errorf("runner: %s is for a recording; a live engine runs at its own pace", c.Op)
	}
	select {
	case r.controls <- c:
		return nil
	case <-r.done:
		return ErrStopped
	}
}

// Status returns the runner's status.
func (r *Runner) Status() feed.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Do runs fn on the engine's goroutine between steps and returns its error. It waits for a
// place in the bounded queue (or ctx) and then for fn to run.
func (r *Runner) Do(ctx context.Context, fn func(e *engine.Engine, now time.Time) error) error {
	errc := make(chan error, 1)
	call := func() { errc <- fn(r.e, r.cfg.Clock()) }
	select {
	case r.calls <- call:
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return ErrStopped
	}
	select {
	case err := <-errc:
		return err
	case <-r.done:
		return ErrStopped
	}
}

// Answer is a prepare-receive answer.
type Answer struct {
	PromptLength        int       `json:"prompt_length"`
	PrefixMatchedLength int       `json:"prefix_matched_length"`
	KVAppendMetadata    string    `json:"kv_append_metadata"`
	Seq                 int64     `json:"-"`
	Runs                [][]int64 `json:"-"`
}

type prepResult struct {
	ans Answer
	err error
}

// PrepRecv queues a prepare-receive request and waits until the engine admits it. If ctx ends
// first (the client went away), the request is aborted as MLC aborts it: a waiting one leaves
// the queue, a prepared one leaks its KV (flagged). With Config.MaxWaiting calls already
// waiting, it refuses the request with ErrBusy and changes nothing.
func (r *Runner) PrepRecv(ctx context.Context, pr engine.PrepRecv) (Answer, error) {
	ch := make(chan prepResult, 1)
	err := r.Do(ctx, func(e *engine.Engine, now time.Time) error {
		if n := r.cfg.MaxWaiting; n > 0 && len(r.prepWait) >= n {
			return fmt.Errorf("prep_recv %s: %d requests are waiting for admission: %w", pr.ID, len(r.prepWait), ErrBusy)
		}
		if err := e.PrepRecv(now, pr); err != nil {
			return err
		}
		r.prepWait[pr.ID] = ch
		return nil
	})
	if err != nil {
		return Answer{}, err
	}
	select {
	case res := <-ch:
		return res.ans, res.err
	case <-ctx.Done():
		// The client went away: abort as MLC does. If the answer came meanwhile, the
		// request is prepared and its KV leaks.
		_ = r.Do(context.Background(), func(e *engine.Engine, now time.Time) error {
			delete(r.prepWait, pr.ID)
			return e.Abort(now, pr.ID)
		})
		return Answer{}, ctx.Err()
	case <-r.done:
		return Answer{}, ErrStopped
	}
}

// StartGenerate starts a prepared request and returns the channel its streamed tokens come
// on; the last one is Final. The runner never waits for the reader: tokens that do not fit
// the channel's buffer wait in a queue of the request's own and follow at the next step.
//
// ctx is the reader's: once it ends the runner stops queueing tokens for it and forgets
// them, whatever the request does next (the caller aborts it). The call itself is made even
// if ctx ends while it waits for the engine, and a request started for a reader already gone
// is aborted at once, as a running request whose client goes away is: a start_generate
// abandoned in the queue must not leave its request prepared, holding its pages.
func (r *Runner) StartGenerate(ctx context.Context, id string, begin int) (<-chan engine.Token, error) {
	var ch chan engine.Token
	err := r.Do(context.WithoutCancel(ctx), func(e *engine.Engine, now time.Time) error {
		rv, ok := e.Request(id)
		if !ok {
			return fmt.Errorf("start_generate %s: %w", id, engine.ErrUnknownRequest)
		}
		if err := e.StartGenerate(now, id, begin); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			if aerr := e.Abort(now, id); aerr != nil {
				return fmt.Errorf("start_generate %s: its client went away; aborting it: %w", id, aerr)
			}
			return fmt.Errorf("start_generate %s: the client went away before the call ran: %w", id, err)
		}
		// Room for every token up to the buffer's bound (max_tokens can be large: no
		// arithmetic on it that could overflow).
		ch = make(chan engine.Token, min(rv.MaxTokens, maxTokenBuffer-2)+2)
		sink := &tokenSink{ch: ch}
		r.tokenWait[id] = sink
		sink.stop = context.AfterFunc(ctx, func() { r.dropSink(id, sink) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ch, nil
}

// dropSink forgets a completion's sink and its queued tokens once its reader has gone.
func (r *Runner) dropSink(id string, sink *tokenSink) {
	_ = r.Do(context.Background(), func(*engine.Engine, time.Time) error {
		if r.tokenWait[id] == sink { // not a later request reusing the id
			delete(r.tokenWait, id)
			delete(r.backedUp, id)
		}
		sink.queue = nil
		return nil
	})
}

// Waiters counts what the runner holds for callers: prep_recv calls waiting for admission,
// completions being streamed, and the tokens queued for readers that have not taken them.
type Waiters struct {
	PrepRecv     int `json:"prep_recv"`
	Streams      int `json:"streams"`
	QueuedTokens int `json:"queued_tokens"`
}

// Waiters returns what the runner holds for callers now, asked on the engine's goroutine.
func (r *Runner) Waiters(ctx context.Context) (Waiters, error) {
	var w Waiters
	err := r.Do(ctx, func(*engine.Engine, time.Time) error {
		w = Waiters{PrepRecv: len(r.prepWait), Streams: len(r.tokenWait)}
		for _, sink := range r.tokenWait {
			w.QueuedTokens += len(sink.queue)
		}
		return nil
	})
	return w, err
}

// publish hands events to subscribers and answers waiting calls. It runs on the Run
// goroutine, between engine calls, so the snapshots it takes match the events exactly.
func (r *Runner) publish(evs []engine.Event, toks []engine.Token) {
	for _, ev := range evs {
		switch e := ev.(type) {
		case engine.MetadataEmitted:
			if ch, ok := r.prepWait[e.ID]; ok {
				delete(r.prepWait, e.ID)
				ans := Answer{PromptLength: e.PromptLength, PrefixMatchedLength: e.Matched, KVAppendMetadata: e.Encoded, Seq: e.Seq}
				ch <- prepResult{ans: ans}
			}
		case engine.RequestAborted:
			if ch, ok := r.prepWait[e.ID]; ok {
				delete(r.prepWait, e.ID)
				ch <- prepResult{err: fmt.Errorf("prep_recv %s: %w (%s)", e.ID, ErrAborted, e.Reason)}
			}
		}
	}
	for _, t := range toks {
		if sink, ok := r.tokenWait[t.ID]; ok {
			sink.queue = append(sink.queue, t)
			r.backedUp[t.ID] = sink
		}
	}
	// Only the sinks with tokens to hand over: a completion whose reader is slow costs the
	// step nothing until it has room again.
	for id, sink := range r.backedUp {
		if sink.flush() {
			delete(r.tokenWait, id)
			sink.stop()
		}
		if len(sink.queue) == 0 {
			delete(r.backedUp, id)
		}
	}
	if len(evs) == 0 {
		return
	}
	r.version++
	for _, o := range r.cfg.Observers {
		o.Observe(r.e, evs)
	}
	r.mu.Lock()
	subs := make([]*Subscription, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	r.mu.Unlock()
	for _, s := range subs {
		s.mb.Offer(evs) // never waits; a refusal is counted and owes a snapshot
	}
}

func (r *Runner) shutdown() {
	for id, ch := range r.prepWait {
		ch <- prepResult{err: fmt.Errorf("prep_recv %s: %w", id, ErrStopped)}
	}
	for _, sink := range r.tokenWait {
		sink.stop()
		close(sink.ch)
	}
	r.mu.Lock()
	subs := r.subs
	r.subs = map[*Subscription]struct{}{}
	r.mu.Unlock()
	for s := range subs {
		s.mb.Close()
	}
}

// Done is closed when Run has returned.
func (r *Runner) Done() <-chan struct{} { return r.done }

// maxTokenBuffer bounds a completion's token channel; a request asking for more tokens gets
// the rest through its queue.
const maxTokenBuffer = 1024

// tokenSink hands a request's tokens to its reader: through the channel while it has room,
// queued (in order) while it has not.
type tokenSink struct {
	ch    chan engine.Token
	queue []engine.Token
	stop  func() bool // stops watching the reader's context
}

// flush moves queued tokens into the channel without waiting, and closes it after the final
// one. It reports whether the sink is done.
func (s *tokenSink) flush() bool {
	for len(s.queue) > 0 {
		select {
		case s.ch <- s.queue[0]:
			final := s.queue[0].Final
			s.queue = s.queue[1:]
			if final {
				close(s.ch)
				return true
			}
		default:
			return false
		}
	}
	return false
}

package tap

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/wire"
)

// obsKind is what the tap saw happen to a request on a decode instance.
type obsKind uint8

const (
	obsArrived  obsKind = iota // a prep_recv call went to D
	obsAdmitted                // D answered it
	obsRefused                 // D refused it (4xx): it never waited there
	obsKV                      // P answered remote_send: the KV is in
	obsStarted                 // D accepted start_generate
	obsTokens                  // tokens streamed
	obsEnded                   // the completion ended (finish_reason), or the call broke off
	obsAborted                 // the client went away, or asked D to abort
	obsReset                   // the shadow starts over
	obsSync                    // nothing: done is closed once what came before is applied
	obsChunk                   // a chunk of a streamed completion, as it came (raw)
)

// obs is one observation for a shadow, stamped with the tap's clock when seen.
type obs struct {
	kind   obsKind
	at     time.Time
	id     string
	pr     engine.PrepRecv
	ans    engine.Answer
	begin  int
	n      int
	tokens []int32
	reason string
	done   chan struct{}
	raw    []byte
}

// shadow is the engine that follows one decode instance, its runner, and the wire server
// that serves its snapshot, stream and metrics. Observations reach it through a bounded
// queue: a forwarded call never waits for the shadow; what does not fit is counted, and the
// shadow starts over.
type shadow struct {
	addr string
	cfg  engine.Config
	t    *Tap

	q        chan obs
	dropped  atomic.Uint64
	overflow atomic.Bool

	mu     sync.Mutex // guards the current engine's runner and server
	r      *runner.Runner
	srv    *wire.Server
	stop   context.CancelFunc
	done   chan struct{}
	resets uint64
	// divergences counts every divergence of every engine this shadow has had.
	divergences atomic.Uint64
	byKind      [8]atomic.Uint64
	lastCause   atomic.Value // string
	held        *obs         // taken off the queue by coalesce, applied next (run's goroutine)
}

func newShadow(t *Tap, addr string, cfg engine.Config) (*shadow, error) {
	s := &shadow{addr: addr, cfg: cfg, t: t, q: make(chan obs, t.cfg.Queue)}
	if err := s.start(); err != nil {
		return nil, err
	}
	t.wg.Add(1)
	go s.run()
	return s, nil
}

// start makes a fresh engine, runner and server (at the first observation, and when the
// shadow starts over).
func (s *shadow) start() error {
	e, err := engine.New(s.cfg)
	if err != nil {
		return fmt.Errorf("tap: %s: %w", s.addr, err)
	}
	e.Follow()
	var observers []runner.Observer
	var collectors []prometheus.Collector
	if s.t.cfg.Observe != nil {
		observers, collectors = s.t.cfg.Observe(s.addr)
	}
	r := runner.New(e, runner.Config{Clock: s.t.cfg.Clock, Manual: true, Observers: observers})
	ctx, cancel := context.WithCancel(s.t.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	srv := wire.NewServer(r, wire.Options{Token: s.t.cfg.Token, Hosts: s.t.cfg.Hosts, Version: s.t.cfg.Version + " tap of " + s.addr,
		Limits: s.t.cfg.Limits, Clock: s.t.cfg.Clock, Logf: s.t.cfg.Logf, NoTrace: true})
	for _, c := range collectors {
		if err := srv.Registry().Register(c); err != nil {
			srv.Close()
			cancel()
			<-done
			return fmt.Errorf("tap: %s: metrics: %w", s.addr, err)
		}
	}
	s.mu.Lock()
	old, oldSrv, oldDone := s.stop, s.srv, s.done
	s.r, s.srv, s.stop, s.done = r, srv, cancel, done
	s.mu.Unlock()
	if old != nil {
		oldSrv.Close()
		old()
		<-oldDone
	}
	return nil
}

// current returns the runner and server of the engine now.
func (s *shadow) current() (*runner.Runner, *wire.Server) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r, s.srv
}

// offer queues an observation without waiting: when the queue is full it is dropped,
// counted, and the shadow starts over once it catches up.
func (s *shadow) offer(o obs) {
	select {
	case s.q <- o:
	default:
		s.dropped.Add(1)
		s.overflow.Store(true)
	}
}

// next returns the queue, or a channel holding the observation coalesce took off it.
func (s *shadow) next() <-chan obs {
	if s.held == nil {
		return s.q
	}
	c := make(chan obs, 1)
	c <- *s.held
	s.held = nil
	return c
}

// run applies observations in order until the tap closes.
func (s *shadow) run() {
	defer s.t.wg.Done()
	for {
		select {
		case <-s.t.ctx.Done():
			s.mu.Lock()
			srv, stop, done := s.srv, s.stop, s.done
			s.mu.Unlock()
			srv.Close()
			stop()
			<-done
			return
		case o := <-s.next():
			if s.overflow.Swap(false) {
				s.reset(o.at, fmt.Sprintf("%d observations were lost (the shadow's queue of %d was full): the shadow starts over", s.dropped.Load(), cap(s.q)))
			}
			if o.kind == obsSync {
				close(o.done)
				continue
			}
			if o.kind == obsReset {
				s.reset(o.at, o.reason)
				continue
			}
			if o.kind == obsChunk {
				// A shadow behind its stream applies what is queued of it at once.
				o = s.coalesce(o)
			}
			s.apply(o)
		}
	}
}

// coalesce joins the chunks of one stream waiting in the queue after o into one
// observation of their tokens (and its end), so that a shadow that fell behind a fast
// stream catches up in one step. It takes only chunks of the same request, and stops at
// anything else (which stays first in line: it is put in s.next).
func (s *shadow) coalesce(o obs) obs {
	toks, n, end := s.parseChunk(o)
	unknown := n > 0 && toks == nil
	for end == "" && len(s.q) > 0 {
		next := <-s.q
		if next.kind != obsChunk || next.id != o.id {
			s.held = &next
			break
		}
		t, k, e := s.parseChunk(next)
		unknown = unknown || (k > 0 && t == nil)
		toks, n, end, o.at = append(toks, t...), n+k, e, next.at
	}
	if unknown {
		toks = nil // ids the stream did not show: the shadow's stand-ins, for all of them
	}
	return obs{kind: obsTokens, at: o.at, id: o.id, n: n, tokens: toks, reason: end}
}

// reset tells the viewers of the current engine that it starts over, and replaces it.
func (s *shadow) reset(at time.Time, cause string) {
	r, _ := s.current()
	_ = r.Do(s.t.ctx, func(e *engine.Engine, _ time.Time) error {
		d := e.FollowReset(at, cause)
		s.count(d)
		return nil
	})
	s.mu.Lock()
	s.resets++
	s.mu.Unlock()
	if err := s.start(); err != nil {
		s.t.logf("tap: %s: %v", s.addr, err)
	}
}

func (s *shadow) count(d engine.Divergence) {
	s.divergences.Add(1)
	if int(d.What) < len(s.byKind) {
		s.byKind[d.What].Add(1)
	}
	s.lastCause.Store(d.What.String() + ": " + d.Cause)
}

// apply drives the engine by one observation, on the runner's goroutine.
func (s *shadow) apply(o obs) {
	r, _ := s.current()
	err := r.Do(s.t.ctx, func(e *engine.Engine, _ time.Time) error {
		before := e.Standing().Divergences
		var err error
		switch o.kind {
		case obsArrived:
			err = e.FollowArrived(o.at, o.pr)
		case obsAdmitted:
			e.FollowAdmitted(o.at, o.id, o.ans)
		case obsRefused:
			e.FollowRefused(o.at, o.id)
		case obsKV:
			err = e.FollowKVReceived(o.at, o.id)
		case obsStarted:
			err = e.FollowStarted(o.at, o.id, o.begin)
		case obsTokens:
			if o.n > 0 {
				e.FollowTokens(o.at, o.id, o.n, o.tokens)
			}
			if o.reason != "" {
				e.FollowEnded(o.at, o.id, o.reason)
			}
		case obsEnded:
			e.FollowEnded(o.at, o.id, o.reason)
		case obsAborted:
			e.FollowAborted(o.at, o.id)
		}
		if st := e.Standing(); st.Divergences > before && st.Last != nil {
			for range st.Divergences - before - 1 {
				s.divergences.Add(1)
			}
			s.count(*st.Last)
		}
		return err
	})
	if err != nil && s.t.ctx.Err() == nil {
		s.t.logf("tap: %s: %s %s: %v", s.addr, kindName(o.kind), o.id, err)
	}
}

func kindName(k obsKind) string {
	return [...]string{"prep_recv", "answer", "refusal", "remote_send answer", "start_generate", "tokens", "end", "abort", "reset", "sync", "chunk"}[k]
}

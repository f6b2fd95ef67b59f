package prepare

import (
	"errors"
	"fmt"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
)

// Config holds the engine settings admission reads (MLC's names; docs/admission.md).
type Config struct {
	PageSize               int
	MaxNumSequence         int
	MaxTotalSequenceLength int
	PrefillChunkSize       int
	// Watermark is the number of pages prepare-receive leaves free: 400 in MLC, where it is
	// hard-coded. kvtop makes it configurable (docs/mlc-differences.md).
	Watermark int
	// SpecFactor is spec_draft_length + 1 with speculative decoding on, else 1.
	SpecFactor int
}

// DefaultWatermark is MLC's hard-coded prepare-receive watermark, in pages.
const DefaultWatermark = 400

// ErrBadConfig is returned by New for settings that admission cannot work with.
var ErrBadConfig = errors.New("prepare: bad configuration")

// IDs hands out internal sequence ids as MLC's IdManager does: recycled ids first, most
// recently recycled first, then new ones counting up from 0.
type IDs struct {
	next      int64
	available []int64
}

// New returns an id.
func (ids *IDs) New() int64 {
	if n := len(ids.available); n > 0 {
		id := ids.available[n-1]
		ids.available = ids.available[:n-1]
		return id
	}
	ids.next++
	return ids.next - 1
}

// Recycle makes an id available again.
func (ids *IDs) Recycle(id int64) { ids.available = append(ids.available, id) }

// Action is the DisaggPrepareReceive action over one engine's caches.
type Action struct {
	cfg Config
	// Caches holds one paged KV cache per model, all of the same geometry (a draft model for
	// speculative decoding is the second). They see the same operations and stay alike;
	// admission reads the first.
	caches []*pages.Cache
	// prefix is the prefix cache; a disabled one matches nothing, holds nothing and evicts
	// nothing, so the action never asks which mode it is in.
	prefix *prefix.Cache
	ids    *IDs

	slots []int64 // scratch
}

// New returns the action.
func New(cfg Config, caches []*pages.Cache, pc *prefix.Cache, ids *IDs) (*Action, error) {
	switch {
	case len(caches) == 0:
		return nil, fmt.Errorf("no KV cache: %w", ErrBadConfig)
	case pc == nil:
		return nil, fmt.Errorf("no prefix cache (pass a disabled one): %w", ErrBadConfig)
	case cfg.PageSize != caches[0].PageSize():
		return nil, fmt.Errorf("page size %d, cache has %d: %w", cfg.PageSize, caches[0].PageSize(), ErrBadConfig)
	case cfg.MaxNumSequence < 1 || cfg.PrefillChunkSize < 1 || cfg.MaxTotalSequenceLength < 1:
		return nil, fmt.Errorf("max_num_sequence %d, prefill_chunk_size %d, max_total_sequence_length %d must be positive: %w",
			cfg.MaxNumSequence, cfg.PrefillChunkSize, cfg.MaxTotalSequenceLength, ErrBadConfig)
	case cfg.Watermark < 0:
		return nil, fmt.Errorf("watermark %d must not be negative: %w", cfg.Watermark, ErrBadConfig)
	case cfg.SpecFactor < 1:
		return nil, fmt.Errorf("spec factor %d must be at least 1: %w", cfg.SpecFactor, ErrBadConfig)
	}
	for i, c := range caches[1:] {
		if c.PageSize() != caches[0].PageSize() || c.NumPages() != caches[0].NumPages() {
			return nil, fmt.Errorf("model %d's cache differs in geometry from model 0's: %w", i+1, ErrBadConfig)
		}
	}
	return &Action{cfg: cfg, caches: caches, prefix: pc, ids: ids}, nil
}

// Config returns the action's settings.
func (a *Action) Config() Config { return a.cfg }

// Prepared is an admitted request: where its KV must land, and how it got there.
type Prepared struct {
	Request      string
	Seq          int64 // the KV sequence the request owns from now on
	PromptLength int
	End          int
	Matched      int
	Match        prefix.Result // Kind, Parent, Pop, Path, Candidates of the prefix match
	// Metadata is the flattened append-position array of all models and Encoded its
	// kv_append_metadata string (docs/kv-cache.md).
	Metadata []int64
	Encoded  string
	// PagesTaken is how many pages the admission took off the free list: those reserved,
	// plus one copy page for a mid-page fork.
	PagesTaken int
	// CopiedPage is the fresh page a mid-page fork copied the shared slots into, or -1.
	CopiedPage int32
	// Extension is what the prefix cache will be told this sequence holds beyond Matched:
	// prompt[matched:end).
	Extension []int32
	// Evaluation is the admission test that passed, with its numbers.
	Evaluation Evaluation
}

// Admit runs the action for the prepare-receive request at the head of the line
// (docs/admission.md): running is the number of running requests with nothing left to prefill. It
// evaluates admission, evicting recycling sequences while HasPrefillSpace fails, and when
// the request passes, reserves its slots. The evaluation says why when it does not
// (ev.Blocked()); the caller then stops admitting for this step, as MLC does. An admitted
// request's prefix-cache extension (Prepared.Extension) is the caller's to queue, after the
// step.
func (a *Action) Admit(running int, req Request) (Prepared, Evaluation) {
	ev := a.evaluate(running, req)
	if ev.Blocked() {
		return Prepared{}, ev
	}
	return a.reserve(req, ev), ev
}

// Evaluate tests admission of req as if it were at the head of the line, without evicting
// anything: the numbers the dashboard shows for it. Recycling and Evictable say what the
// eviction loop could free.
func (a *Action) Evaluate(running int, req Request) Evaluation {
	ev := a.measure(running, req)
	ev.Reason = ev.firstFailure()
	a.explain(&ev)
	return ev
}

// measure reads the numbers admission tests from the caches as they are now.
func (a *Action) measure(running int, req Request) Evaluation {
	c := a.caches[0]
	end, _ := req.ResolveEnd()
	return Evaluation{
		Request:                req.ID,
		PromptLength:           len(req.Prompt),
		End:                    end,
		Running:                running,
		FreePages:              c.NumAvailablePages(),
		TotalPages:             c.NumPages(),
		Required:               (max(end, 0) + a.cfg.PageSize - 1) / a.cfg.PageSize,
		Watermark:              a.cfg.Watermark,
		MaxNumSequence:         a.cfg.MaxNumSequence,
		PrefillChunkSize:       a.cfg.PrefillChunkSize,
		SpecFactor:             a.cfg.SpecFactor,
		TotalSequenceLength:    c.TotalSequenceLength(),
		MaxTotalSequenceLength: a.cfg.MaxTotalSequenceLength,
	}
}

// explain fills in what eviction could still free.
func (a *Action) explain(ev *Evaluation) {
	rec := a.prefix.Recycling()
	ev.Recycling = len(rec)
	ev.Evictable = a.caches[0].PagesFreedByRemoving(rec)
}

// evaluate is admission (docs/admission.md) for the request at the head of the line: the decode
// guard, the window, then, while HasPrefillSpace(required, running, end) fails, eviction of
// recycling sequences, then CanPrefill. The numbers are those after eviction.
func (a *Action) evaluate(running int, req Request) Evaluation {
	ev := a.measure(running, req)
	switch _, err := req.ResolveEnd(); {
	case running > ev.FreePages:
		ev.Reason = ReasonDecodeGuard
	case err != nil:
		ev.Reason = ReasonWindow
	default:
		for !ev.hasPrefillSpace(running) && a.prefix.TryFreeMemory() {
			evicted := ev.Evicted + 1
			ev = a.measure(running, req)
			ev.Evicted = evicted
		}
		ev.Reason = ev.firstFailure()
	}
	if ev.Blocked() {
		a.explain(&ev)
	}
	return ev
}

// reserve is the body of the action for an admitted request, in MLC's order: match, add, fork or reuse the KV sequence,
// reserve the slots P will write, and commit the extensions earlier steps queued.
func (a *Action) reserve(req Request, ev Evaluation) Prepared {
	end := ev.End
	free := a.caches[0].NumAvailablePages()
	p := Prepared{
		Request: req.ID, PromptLength: len(req.Prompt), End: end, CopiedPage: -1, Evaluation: ev,
		Match: prefix.Result{Kind: prefix.Fresh, Parent: -1},
	}
	seq := a.ids.New()
	// 1. Prefix match (a disabled cache answers Fresh), and 3: a sequence the prefix cache
	// does not hold gets its KV sequence now.
	if end > 0 {
		res, err := a.prefix.InsertSequence(seq, req.Prompt[:end], prefix.NoWindow)
		if err != nil {
			panic(fmt.Sprintf("prepare: %s: insert sequence %d: %v", req.ID, seq, err))
		}
		p.Match = res
	}
	switch res := p.Match; res.Kind {
	case prefix.Fork:
		a.each(func(c *pages.Cache) error { return c.ForkSequence(res.Parent, seq, res.Offset) })
		if res.Offset%a.cfg.PageSize != 0 {
			pgs, _ := a.caches[0].SequencePages(seq, nil)
			p.CopiedPage = pgs[len(pgs)-1]
		}
	case prefix.Reuse:
		a.ids.Recycle(seq)
		seq = res.Parent
		if res.Pop > 0 {
			a.each(func(c *pages.Cache) error { return c.PopN(seq, res.Pop) })
		}
	default:
		a.each(func(c *pages.Cache) error { return c.AddSequence(seq) })
	}
	p.Matched = p.Match.Offset
	p.Seq = seq
	// 2. The request is alive; it is not left in the running queue (the caller's business).
	// 4. Reserve the slots P will write, per model, and compress them.
	n := end - p.Matched
	if n > 0 {
		for _, c := range a.caches {
			var err error
			a.slots, err = c.ReserveAppend(seq, n, a.slots[:0])
			if err != nil {
				// Admission checked for ceil(end / page_size) pages before matching, and a
				// match never needs more: this cannot fail unless the cache is broken.
				panic(fmt.Sprintf("prepare: %s: %v", req.ID, err))
			}
			p.Metadata = pages.Compress(p.Metadata, a.slots)
		}
		p.Extension = req.Prompt[p.Matched:end]
	} else {
		for range a.caches {
			p.Metadata = append(p.Metadata, 0)
		}
	}
	// 5. Commit extensions queued by earlier steps.
	a.prefix.CommitSequenceExtension()
	// 6 and 7: the caller removes the request from its queue and answers.
	p.Encoded = Encode(p.Metadata)
	p.PagesTaken = free - a.caches[0].NumAvailablePages()
	return p
}

// each applies an operation to every model's cache. The caches are alike, so an error is a
// broken invariant.
func (a *Action) each(op func(*pages.Cache) error) {
	for _, c := range a.caches {
		if err := op(c); err != nil {
			panic(fmt.Sprintf("prepare: %v", err))
		}
	}
}

// ErrNoRoom refuses Force for a request whose slots do not fit even after eviction.
var ErrNoRoom = errors.New("prepare: no room for the request's slots")

// Force runs the body of the action for a request that admission would refuse, because a
// real decode instance admitted it (a follower learns of it from the answer): recycling
// sequences are evicted while the pages the request can take (its required pages, and a
// page a mid-page fork copies into) are not free, then its slots are reserved as Admit
// would reserve them. ev is the evaluation that refused it, and is returned with the
// prepared request. When the slots cannot fit even after every eviction, nothing is
// reserved and ErrNoRoom says how far it is short (the evictions stay done).
func (a *Action) Force(req Request, ev Evaluation) (Prepared, error) {
	end, err := req.ResolveEnd()
	if err != nil {
		return Prepared{}, err
	}
	need := (end+a.cfg.PageSize-1)/a.cfg.PageSize + 1
	for a.caches[0].NumAvailablePages() < need && a.prefix.TryFreeMemory() {
		ev.Evicted++
	}
	if free := a.caches[0].NumAvailablePages(); free < need {
		return Prepared{}, fmt.Errorf("%s: %d pages needed, %d free after evicting every recycling sequence: %w", req.ID, need, free, ErrNoRoom)
	}
	ev.End = end
	return a.reserve(req, ev), nil
}

package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
)

// ErrBadConfig is returned by New for settings the engine cannot run with.
var ErrBadConfig = errors.New("engine: bad configuration")

// Config is the decode instance's configuration: MLC's engine settings (docs/mlc-differences.md, MLC
// names in the comments) and kvtop's own options. Start from DefaultConfig.
type Config struct {
	PageSize                int `json:"page_size"`                  // kv_cache_page_size
	MaxNumSequence          int `json:"max_num_sequence"`           // max_num_sequence
	MaxTotalSequenceLength  int `json:"max_total_sequence_length"`  // sets the page count
	MaxSingleSequenceLength int `json:"max_single_sequence_length"` // longer prompts are refused (capped by the total)
	PrefillChunkSize        int `json:"prefill_chunk_size"`         // prefill budget per step
	// PrefixCache is "radix" or "disable" (prefix_cache_mode).
	PrefixCache string `json:"prefix_cache"`
	// MaxRecycling is prefix_cache_max_num_recycling_seqs: -1 unbounded, 0 none, or
	// RecyclingAsBatch for max_num_sequence, MLC's default.
	MaxRecycling int `json:"max_recycling"`
	// EvictOrder is which recycling sequence the prefix cache evicts: MLC's (the zero value,
	// libstdc++'s hash-map order, usually the most recently recycled) or the least recently
	// recycled (what MLC's code means to do). docs/prefix-cache.md.
	EvictOrder prefix.EvictOrder `json:"evict_order"`
	// Counterfactual runs a second prefix cache, of tokens only, under the other eviction
	// order over the same requests, to show the hit ratio that order would have given. On
	// by default.
	Counterfactual bool `json:"counterfactual"`
	// Watermark is the prepare-receive watermark in pages (400, hard-coded in MLC).
	Watermark int `json:"watermark"`
	// SpecDraftLength > 0 turns speculative decoding's accounting on: spec_factor is
	// SpecDraftLength + 1 in admission.
	SpecDraftLength int `json:"spec_draft_length"`
	// Models is the number of models sharing the cache geometry (2 with a draft model). Their
	// metadata arrays are concatenated.
	Models int `json:"models"`

	// Arena is the KV payload geometry per model; zero keeps no payload (the default).
	Arena pages.Geometry `json:"arena"`
	// ArenaLimit caps the arena's size in bytes, all models together.
	ArenaLimit int64 `json:"arena_limit"`

	// Seed makes the simulated tokens: the same seed gives the same tokens.
	Seed uint64 `json:"seed"`
	// VocabSize bounds the simulated token ids.
	VocabSize int `json:"vocab_size"`

	// PreparedAgeLimit flags a prepared request still waiting for its KV or its
	// start_generate after this long: a likely leak. Zero turns the hazard off.
	PreparedAgeLimit time.Duration `json:"prepared_age_limit"`
	// ReclaimAfter, when not zero, frees the KV of a prepared request (aborting it) and of an
	// aborted request's leaked sequence after this long. MLC never does (docs/mlc-differences.md); off by
	// default.
	ReclaimAfter time.Duration `json:"reclaim_after"`
	// ExcludeUnreceived keeps a prepared sequence's prompt out of the prefix cache until its
	// KV has arrived, so nothing forks from KV that is not there. MLC does not (docs/mlc-differences.md); off
	// by default.
	ExcludeUnreceived bool `json:"exclude_unreceived"`

	// KeepFinished is how many finished or aborted requests the engine remembers for viewers.
	KeepFinished int `json:"keep_finished"`
	// KeepMetadata is how many recent kv_append_metadata emissions a snapshot carries.
	KeepMetadata int `json:"keep_metadata"`
}

// DefaultConfig returns kvtop's defaults: MLC's, except a KV capacity of 32,768 tokens (MLC's
// 4,096 gives 257 pages, which the 400-page watermark never admits) and a batch of 32
// (MLC's 4 keeps a demo from showing anything at once).
func DefaultConfig() Config {
	return Config{
		PageSize:                16,
		MaxNumSequence:          32,
		MaxTotalSequenceLength:  32768,
		MaxSingleSequenceLength: 32768,
		PrefillChunkSize:        1024,
		PrefixCache:             "radix",
		MaxRecycling:            RecyclingAsBatch,
		Counterfactual:          true,
		Watermark:               prepare.DefaultWatermark,
		Models:                  1,
		ArenaLimit:              4 << 30,
		Seed:                    1,
		VocabSize:               32000,
		PreparedAgeLimit:        30 * time.Second,
		KeepFinished:            256,
		KeepMetadata:            64,
	}
}

// RecyclingAsBatch, as Config.MaxRecycling, keeps as many recycling sequences as
// max_num_sequence allows running: MLC's default.
const RecyclingAsBatch = -2

// NumPages returns the page count the configuration gives (docs/kv-cache.md).
func (c Config) NumPages() int {
	return pages.NumPagesFor(c.MaxTotalSequenceLength, c.PageSize, c.MaxNumSequence, false)
}

// SpecFactor returns spec_draft_length + 1 with speculative decoding on, else 1.
func (c Config) SpecFactor() int { return c.SpecDraftLength + 1 }

// Recycling returns the effective recycling cap.
func (c Config) Recycling() int {
	if c.MaxRecycling == RecyclingAsBatch {
		return c.MaxNumSequence
	}
	return c.MaxRecycling
}

// Validate reports the first setting the engine cannot run with.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("engine: %s: %w", fmt.Sprintf(format, args...), ErrBadConfig)
	}
	switch {
	case c.PageSize < 1 || c.PageSize > 1024:
		return bad("page size %d must be in [1, 1024]", c.PageSize)
	case c.MaxNumSequence < 1:
		return bad("max_num_sequence %d must be positive", c.MaxNumSequence)
	case c.MaxTotalSequenceLength < c.PageSize:
		return bad("max_total_sequence_length %d must be at least a page (%d)", c.MaxTotalSequenceLength, c.PageSize)
	case c.MaxTotalSequenceLength > 1<<31-1 || int64(c.NumPages())*int64(c.PageSize) > 1<<31-1:
		return bad("max_total_sequence_length %d is too large", c.MaxTotalSequenceLength)
	case c.MaxSingleSequenceLength < 2:
		return bad("max_single_sequence_length %d must be at least 2", c.MaxSingleSequenceLength)
	case c.PrefillChunkSize < 1:
		return bad("prefill_chunk_size %d must be positive", c.PrefillChunkSize)
	case c.PrefixCache != "radix" && c.PrefixCache != "disable":
		return bad("prefix cache mode %q must be radix or disable", c.PrefixCache)
	case c.EvictOrder != prefix.EvictMLC && c.EvictOrder != prefix.EvictLRU:
		return bad("eviction order %v must be mlc or lru", c.EvictOrder)
	case c.Recycling() < -1:
		return bad("max recycling %d must be -1 (unbounded), 0 or positive", c.Recycling())
	case c.Watermark < 0:
		return bad("watermark %d must not be negative", c.Watermark)
	case c.SpecDraftLength < 0:
		return bad("spec draft length %d must not be negative", c.SpecDraftLength)
	case c.Models < 1 || c.Models > 4:
		return bad("models %d must be in [1, 4]", c.Models)
	case c.Arena.Layers < 0 || c.Arena.KVHeads < 0 || c.Arena.HeadDim < 0:
		return bad("arena geometry %+v has a negative dimension", c.Arena)
	case !c.Arena.Zero() && c.checkArena() != nil:
		return bad("%v", c.checkArena())
	case c.VocabSize < 2:
		return bad("vocab size %d must be at least 2", c.VocabSize)
	case c.PreparedAgeLimit < 0 || c.ReclaimAfter < 0:
		return bad("prepared age limit %v and reclaim-after %v must not be negative", c.PreparedAgeLimit, c.ReclaimAfter)
	case c.KeepFinished < 0 || c.KeepMetadata < 0:
		return bad("keep-finished %d and keep-metadata %d must not be negative", c.KeepFinished, c.KeepMetadata)
	}
	return nil
}

// checkArena reports a KV arena, all models together, that is over the limit, its size
// computed without overflow: a geometry whose size wraps around must not pass for a small
// one. (ArenaSize bounds one model's arena far below 2^63 / 4, so the models cannot
// overflow it.)
func (c Config) checkArena() error {
	size, err := pages.ArenaSize(c.Arena, c.NumPages(), c.PageSize)
	if err != nil {
		return fmt.Errorf("arena geometry %dx%dx%d: %v", c.Arena.Layers, c.Arena.KVHeads, c.Arena.HeadDim, err)
	}
	if size *= int64(c.Models); size > c.ArenaLimit {
		return fmt.Errorf("a KV arena of %d bytes is over the limit of %d", size, c.ArenaLimit)
	}
	return nil
}

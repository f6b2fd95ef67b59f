package main

import (
	"flag"
	"fmt"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
)

// engineFlags registers the engine settings shared by the demo and serve, and returns a
// function that builds the validated configuration once the flags are parsed: the flags
// given on the command line are applied over a base (the defaults, or a scenario's), the
// others leave it as it is.
func engineFlags(fs *flag.FlagSet) func(base engine.Config) (engine.Config, float64, error) {
	d := engine.DefaultConfig() // for the defaults --help shows
	pageSize := fs.Int("page-size", d.PageSize, "KV cache page size in tokens (MLC's kv_cache_page_size)")
	maxTotal := fs.Int("max-total-seq-len", d.MaxTotalSequenceLength,
		"KV capacity in tokens; sets the page count (ceil(len/page)+1). MLC's default of 4096 gives\n257 pages, which the 400-page prepare-receive watermark never admits")
	maxNumSeq := fs.Int("max-num-seq", d.MaxNumSequence,
		"batch limit, MLC's max_num_sequence. MLC's default is 4; kvtop's 32 lets a demo keep\nseveral requests decoding while others wait on prepare-receive, so every panel has something to show")
	maxSingle := fs.Int("max-single-seq-len", d.MaxSingleSequenceLength, "longest prompt accepted, in tokens (capped by --max-total-seq-len)")
	chunk := fs.Int("prefill-chunk", d.PrefillChunkSize, "prefill budget per step in tokens (MLC's prefill_chunk_size)")
	prefixMode := fs.String("prefix-cache", d.PrefixCache, "prefix cache mode: radix or disable")
	maxRecycling := fs.Int("max-recycling", d.MaxRecycling,
		"finished sequences kept for reuse: -1 unbounded, 0 none; the default (-2) is max-num-seq, as in MLC")
	evictOrder := fs.String("evict-order", d.EvictOrder.String(),
		"which recycling sequence the prefix cache evicts: mlc (MLC's real order, libstdc++'s hash-map\norder, usually the most recently recycled) or lru (the least recently recycled, what MLC's code means)")
	watermark := fs.Int("watermark", d.Watermark, "pages prepare-receive leaves free (hard-coded 400 in MLC)")
	specDraft := fs.Int("spec-draft-len", d.SpecDraftLength, "speculative draft length; > 0 multiplies the batch by draft+1 in admission")
	models := fs.Int("models", d.Models, "models sharing the cache geometry (2 with a draft model); their metadata is concatenated")
	arena := fs.String("arena", "", "KV payload geometry LAYERSxKV_HEADSxHEAD_DIM (fp16), e.g. 32x8x128; empty keeps no payload")
	arenaLimit := fs.Int64("arena-limit", d.ArenaLimit, "largest KV arena allowed, in bytes (all models)")
	ageLimit := fs.Duration("age-limit", d.PreparedAgeLimit, "flag a request prepared longer than this (likely leak); 0 disables")
	reclaim := fs.Duration("reclaim-after", 0, "free prepared and leaked KV after this long (MLC never does); 0 disables")
	exclude := fs.Bool("exclude-unreceived", false, "keep a prompt out of the prefix cache until its KV has arrived (MLC does not)")
	seed := fs.Uint64("seed", d.Seed, "seed of the simulated tokens (and of the workload)")
	keep := fs.Int("keep-finished", d.KeepFinished, "finished requests remembered for the dashboard")
	rate := fs.Float64("steps-per-sec", 0, "engine steps per second; 0 runs as fast as possible")
	return func(base engine.Config) (engine.Config, float64, error) {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		c := base
		apply := func(name string, f func()) {
			if set[name] {
				f()
			}
		}
		apply("page-size", func() { c.PageSize = *pageSize })
		apply("max-total-seq-len", func() { c.MaxTotalSequenceLength = *maxTotal })
		apply("max-num-seq", func() { c.MaxNumSequence = *maxNumSeq })
		apply("max-single-seq-len", func() { c.MaxSingleSequenceLength = *maxSingle })
		apply("prefill-chunk", func() { c.PrefillChunkSize = *chunk })
		apply("prefix-cache", func() { c.PrefixCache = *prefixMode })
		apply("max-recycling", func() { c.MaxRecycling = *maxRecycling })
		apply("watermark", func() { c.Watermark = *watermark })
		if set["evict-order"] {
			if err := c.EvictOrder.UnmarshalText([]byte(*evictOrder)); err != nil {
				return c, 0, fmt.Errorf("--evict-order %q: want mlc or lru", *evictOrder)
			}
		}
		apply("spec-draft-len", func() { c.SpecDraftLength = *specDraft })
		apply("models", func() { c.Models = *models })
		apply("arena-limit", func() { c.ArenaLimit = *arenaLimit })
		apply("age-limit", func() { c.PreparedAgeLimit = *ageLimit })
		apply("reclaim-after", func() { c.ReclaimAfter = *reclaim })
		apply("exclude-unreceived", func() { c.ExcludeUnreceived = *exclude })
		apply("seed", func() { c.Seed = *seed })
		apply("keep-finished", func() { c.KeepFinished = *keep })
		if *arena != "" {
			var g pages.Geometry
			var rest string
			if n, _ := fmt.Sscanf(*arena+" ", "%dx%dx%d%s", &g.Layers, &g.KVHeads, &g.HeadDim, &rest); n != 3 || g.Layers <= 0 || g.KVHeads <= 0 || g.HeadDim <= 0 {
				return c, 0, fmt.Errorf("--arena %q: want LAYERSxKV_HEADSxHEAD_DIM with positive numbers, e.g. 32x8x128", *arena)
			}
			c.Arena = g
		}
		if err := c.Validate(); err != nil {
			return c, 0, err
		}
		return c, *rate, nil
	}
}

// Package vectors reads the recorded answers of the upstream code that kvtop reproduces:
// TVM's paged KV cache and MLC LLM's prefix cache, built for CPU with GCC 12 and libstdc++ and
// driven through the calls MLC makes. testdata/README.md says where they come from.
//
// A vector file is a list of scripts separated by blank lines. A script opens with a header
// line "## " and its configuration, then holds one operation a line, "OP ARGS => ANSWER", to
// be replayed in order on one fresh instance. Lines that start with "#" (and not "## ") are
// comments.
//
// # Usage
//
//	scripts, err := vectors.Load("kvcache.txt")
//	for _, s := range scripts {
//		for _, op := range s.Ops {
//			switch op.Name {
//			case "kv_reserve": // op.Args, op.Answer
//			}
//		}
//	}
//
// Only tests import vectors: the files are embedded, compressed, into the package.
//
// # Imports
//
// vectors imports nothing of kvtop.
package vectors

// Package kvevents speaks vLLM's KV-event contract (vllm/distributed/kv_events.py), the
// feed that KV-aware routers such as NVIDIA Dynamo and llm-d index every instance's prefix
// cache from: it publishes kvtop's prefix-cache blocks in it, and reads any publisher's
// (vLLM, SGLang, TensorRT-LLM, kvtop).
//
// # The contract
//
// A publisher's ZMQ PUB socket sends one message a batch, [topic, seq, payload]: the topic
// (empty by default), a sequence number (8 bytes, big-endian, from 0, one more each batch)
// and the batch in msgpack, an array [ts, events, data_parallel_rank] with ts in seconds.
// Events are BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id,
// medium, lora_name}, BlockRemoved {block_hashes, medium} and AllBlocksCleared {}, each as a
// map with a "type" key (Map, vLLM's current encoding) or as an array with its tag first
// (Array, the older one). A ROUTER socket answers a replay request, an 8-byte big-endian
// start seq (after the empty delimiter a REQ socket sends), with [seq, payload] for each
// batch it keeps from there, then [-1, ""].
//
// kvtop's blocks are those of package engine/blocks: a block is one full page of a cached
// sequence, its hash a 64-bit integer chained over its parent's and its tokens. The first
// batch a Publisher sends is AllBlocksCleared (and whatever the cache holds already), so an
// indexer forgets what an earlier run of the instance had.
//
// # Streams
//
// A Publisher's own Stream publishes under Config.Topic. NewStream starts another under a
// topic of its own, with its own sequence, queue, sender and replay ring, on the same
// sockets: a tap publishes each decode instance it follows so, a topic an instance, as
// llm-d's indexer reads a fleet (kv@POD@MODEL). A replay request may name the topic before
// its start seq, ["", topic, start], and is then answered from that stream, the answers
// carrying the topic; vLLM's ["", start] is answered from the publisher's own. A subscriber
// follows each topic's sequence apart (SubscriberConfig.ReplayByTopic names it in replays).
//
// # Usage
//
//	p, err := kvevents.Start(kvevents.Config{Endpoint: "tcp://127.0.0.1:5557",
//		ReplayEndpoint: "tcp://127.0.0.1:5558"})
//	r := runner.New(e, runner.Config{Observers: []runner.Observer{p}, ...})
//	...
//	err = kvevents.Subscribe(ctx, kvevents.SubscriberConfig{Endpoint: "tcp://127.0.0.1:5557",
//		ReplayEndpoint: "tcp://127.0.0.1:5558"}, func(m kvevents.Message) error { ... })
//
// # Concurrency
//
// Observe runs on the engine's goroutine and never waits: a blocks.Reader notes which
// sequences' blocks changed and copies out the tokens of the pages that became full, into
// an Ops of the engine's goroutine alone, and hands that to the sender in a box: the box
// last queued while the sender has not taken it (up to 16 observations), a new one on the
// sender's bounded queue otherwise (Config.Queue). An observation that does not fit is
// dropped and counted, and the next one that fits starts subscribers over. The sender
// hashes the pages (a blocks.Tracker), encodes, numbers and sends on a goroutine of its
// own, and keeps the last Config.Buffer batches for replay, which a third goroutine serves.
// Once it has emptied the queue the sender lingers (Config.Linger) before it waits on it
// again, so that a busy engine hands over a box about once a linger rather than once a
// call, and seldom wakes it (BENCHMARKS.md). zmq4 writes to a peer with no deadline, so
// the sockets' TCP writes time out: a subscriber that stops reading is cut off and the
// others go on. Decode is safe for concurrent use.
package kvevents

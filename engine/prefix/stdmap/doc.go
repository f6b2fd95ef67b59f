// Package stdmap reproduces the iteration order of libstdc++'s (GCC 12)
// std::unordered_map<size_t, int64_t> with its default hash, so that kvtop evicts the
// sequence MLC LLM evicts.
//
// MLC's PrefixCache::TryFreeMemory removes the entry at begin() of such a map, keyed by a
// counter that grows by one at every RecycleSequence. Its comment says that is the oldest
// recycled sequence; it is not, because libstdc++'s hash table does not iterate in key
// order, and the victim is usually the most recently recycled sequence. Map follows the
// table's layout exactly:
//
//   - std::hash<size_t> is the identity, so a key lives in bucket key mod the bucket count.
//   - All nodes sit on one singly linked list, which is the iteration order; the nodes of a
//     bucket are contiguous on it. A node landing in an empty bucket goes to the front of the
//     whole list; one landing in an occupied bucket goes to the front of that bucket's run.
//   - Erasing a node unlinks it and moves nothing else.
//   - The bucket count follows libstdc++'s prime rehash policy at load factor 1: a
//     default-constructed table has one bucket; the first insertion makes 13; inserting past
//     the bucket count grows it to the first prime of libstdc++'s table at least twice the
//     count (13, 29, 59, 127, 257, 541, …). A rehash walks the old list in order and inserts
//     every node into the new buckets by the same front rules. The count never shrinks.
//
// Only the order and the bucket count are reproduced; Map itself is an ordinary Go
// structure in which Front is O(1) and Insert and Erase are O(1) but for rehashes.
//
// # Concurrency
//
// A Map is not safe for concurrent use.
package stdmap

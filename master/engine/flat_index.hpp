// An index from a string key to an owned entry, by open addressing: the
// limiter's per-domain map of identifiers to their states.
//
// Why not std::unordered_map: at 100k+ identifiers every lookup misses the
// cache, and a node-based map reads the bucket array, then the node before
// the bucket's first (another identifier's), then the node itself; with the
// bucket index a division. Here one slot (the key's full hash and a pointer)
// is read, then the entry, whose key is compared only when the hashes match:
// at the master's ingest rates the lookup was 44% of its time
// (docs/benchmarks.md, "Master ingest").
//
// Linear probing over a power-of-two table at most half full; erasure
// shifts the following slots back (no tombstones). Entries are allocated one
// by one and never move: pointers to them stay valid until they are erased.
// Entry must have a `std::string key` member, set here. Single-threaded.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smockron::master {

template <class Entry>
class flat_index {
public:
  static std::uint64_t hash(std::string_view key) { return std::hash<std::string_view>{}(key); }

  /// The entry of `key` (its hash `h`), or null.
  Entry* find(std::string_view key, std::uint64_t h) const {
    if (size_ == 0) return nullptr;
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const slot& s = slots_[i];
      if (!s.e) return nullptr;
      if (s.h == h && s.e->key == key) return s.e.get();
    }
  }
  Entry* find(std::string_view key) const { return find(key, hash(key)); }

  /// A new entry for `key`, which must not be present.
  Entry* insert(std::string_view key, std::uint64_t h) {
    if ((size_ + 1) * 2 > slots_.size()) grow(std::max<std::size_t>(16, slots_.size() * 2));
    auto e = std::make_unique<Entry>();
    e->key.assign(key);
    Entry* out = e.get();
    place({h, std::move(e)});
    ++size_;
    return out;
  }
  Entry* insert(std::string_view key) { return insert(key, hash(key)); }

  /// Removes and frees `e` (an entry of this index).
  void erase(Entry* e) {
    std::size_t i = hash(e->key) & mask_;
    while (slots_[i].e.get() != e) i = (i + 1) & mask_;
    slots_[i].e.reset();
    --size_;
    // Backward shift: a later slot of the run moves into the hole unless its
    // home lies cyclically in (hole, its position].
    for (std::size_t j = (i + 1) & mask_; slots_[j].e; j = (j + 1) & mask_) {
      const std::size_t home = slots_[j].h & mask_;
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = std::move(slots_[j]);
      i = j;
    }
  }

  /// Room for `n` entries without growing.
  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    if (cap > slots_.size()) grow(cap);
  }

  std::size_t size() const { return size_; }

  /// Calls f(Entry&) for every entry (which f must not insert or erase).
  template <class F>
  void for_each(F f) {
    for (auto& s : slots_)
      if (s.e) f(*s.e);
  }

private:
  struct slot {
    std::uint64_t h = 0;
    std::unique_ptr<Entry> e;  ///< null: empty
  };

  void place(slot s) {
    std::size_t i = s.h & mask_;
    while (slots_[i].e) i = (i + 1) & mask_;
    slots_[i] = std::move(s);
  }
  void grow(std::size_t cap) {
    std::vector<slot> old = std::exchange(slots_, std::vector<slot>(cap));
    mask_ = cap - 1;
    for (auto& s : old)
      if (s.e) place(std::move(s));
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace smockron::master

// The kept lists of one LayerResult, read in place whichever encoding carried them: the
// repeated offsets / indices fields, or the little-endian bytes of LayerResult.packed
// (ANSWER_ENCODING_PACKED, kvtrim/v1/packed_lists.h). No index is copied until asked for.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim {

/// A view of the CSR lists of one LayerResult: list i holds the indices
/// [begin(i), end(i)) of index(). Valid while the LayerResult lives and is not modified.
class KeptLists {
 public:
  /// Checks the form of the lists and views them. Packed lists must have index_bytes 2 or 4,
  /// wide enough for n (2: n <= 65536), byte lengths that are whole multiples of 8 (offsets) and index_bytes
  /// (indices), and the repeated fields left empty; either form needs at least two offsets
  /// that start at 0, never decrease and end at the number of indices. Index values are not
  /// read (the server writes them ascending within [0, n)). Errors: DATA_LOSS naming the field
  /// under `field` ("layer.packed.indices: ..."); FAILED_PRECONDITION when the lists went to
  /// the layer's output region (LayerResult.output_written).
  static absl::StatusOr<KeptLists> Of(const v1::LayerResult& result,
                                      absl::string_view field = "layer");

  /// True when the lists came packed.
  bool packed() const { return packed_; }
  /// Number of lists: H_kv per head, 1 shared or block-aligned.
  int64_t num_lists() const { return num_offsets_ - 1; }
  /// Number of kept indices over every list.
  int64_t num_indices() const { return num_indices_; }
  /// Offset of list `list` (0 <= list <= num_lists()).
  int64_t offset(int64_t list) const;
  /// The `i`-th kept index over every list (0 <= i < num_indices()); for one at a time (see
  /// CopyIndices for many).
  int32_t index(int64_t i) const;
  /// Copies the indices [begin, end) (over every list) into `out` [end - begin]: one tight
  /// loop per width, the way to move many indices.
  void CopyIndices(int64_t begin, int64_t end, int32_t* out) const;
  /// The indices of list `list`, copied.
  std::vector<int32_t> List(int64_t list) const;

 private:
  KeptLists() = default;

  const v1::LayerResult* result_ = nullptr;
  bool packed_ = false;
  const char* offset_bytes_ = nullptr;  // packed: 8 bytes per offset
  const char* index_bytes_ = nullptr;   // packed: width_ bytes per index
  uint32_t width_ = 0;
  int64_t num_offsets_ = 0;
  int64_t num_indices_ = 0;
};

}  // namespace kvtrim

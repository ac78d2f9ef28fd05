#include "client/kept_lists.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtrim/v1/packed_lists.h"

namespace kvtrim {

namespace {

/// DATA_LOSS "<field>.<what>: <why>".
absl::Status Malformed(absl::string_view field, absl::string_view what, absl::string_view why) {
  return absl::DataLossError(absl::StrCat(field, ".", what, ": ", why));
}

}  // namespace

absl::StatusOr<KeptLists> KeptLists::Of(const v1::LayerResult& result, absl::string_view field) {
  if (result.output_written()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".output_written: the lists went to the layer's output region; read them there"));
  }
  KeptLists view;
  view.result_ = &result;
  view.packed_ = result.has_packed();
  if (view.packed_) {
    const v1::PackedLists& p = result.packed();
    if (result.offsets_size() != 0 || result.indices_size() != 0) {
      return Malformed(field, "packed", "sent beside repeated offsets / indices; expected one form");
    }
    if (p.index_bytes() != 2 && p.index_bytes() != 4) {
      return Malformed(field, "packed.index_bytes",
                       absl::StrCat("must be 2 or 4, got ", p.index_bytes()));
    }
    if (result.num_tokens() > v1::PackedIndexCapacity(p.index_bytes())) {
      return Malformed(field, "packed.index_bytes",
                       absl::StrCat(p.index_bytes(), " cannot hold the indices of n = ",
                                    result.num_tokens()));
    }
    if (p.offsets().size() % 8 != 0) {
      return Malformed(field, "packed.offsets",
                       absl::StrCat(p.offsets().size(), " bytes is not a whole number of int64"));
    }
    if (p.indices().size() % p.index_bytes() != 0) {
      return Malformed(field, "packed.indices",
                       absl::StrCat(p.indices().size(), " bytes is not a whole number of ",
                                    p.index_bytes(), "-byte indices"));
    }
    view.width_ = p.index_bytes();
    view.offset_bytes_ = p.offsets().data();
    view.index_bytes_ = p.indices().data();
    view.num_offsets_ = static_cast<int64_t>(p.offsets().size() / 8);
    view.num_indices_ = static_cast<int64_t>(p.indices().size() / p.index_bytes());
  } else {
    view.num_offsets_ = result.offsets_size();
    view.num_indices_ = result.indices_size();
  }
  const absl::string_view offsets = view.packed_ ? "packed.offsets" : "offsets";
  if (view.num_offsets_ < 2) {
    return Malformed(field, offsets, absl::StrCat("needs at least 2 offsets, got ", view.num_offsets_));
  }
  int64_t previous = 0;
  for (int64_t i = 0; i < view.num_offsets_; ++i) {
    const int64_t at = view.offset(i);
    if ((i == 0 && at != 0) || at < previous) {
      return Malformed(field, offsets, absl::StrCat("offset ", i, " is ", at, " after ", previous,
                                                    "; offsets start at 0 and never decrease"));
    }
    previous = at;
  }
  if (previous != view.num_indices_) {
    return Malformed(field, offsets, absl::StrCat("end at ", previous, " but ", view.num_indices_,
                                                  " indices were sent"));
  }
  return view;
}

int64_t KeptLists::offset(int64_t list) const {
  if (!packed_) return result_->offsets(static_cast<int>(list));
  return static_cast<int64_t>(v1::LoadLittleEndian(offset_bytes_ + 8 * list, 8));
}

int32_t KeptLists::index(int64_t i) const {
  if (!packed_) return result_->indices(static_cast<int>(i));
  return static_cast<int32_t>(v1::LoadLittleEndian(index_bytes_ + width_ * i, width_));
}

void KeptLists::CopyIndices(int64_t begin, int64_t end, int32_t* out) const {
  if (end <= begin) return;
  if (packed_) {
    v1::UnpackIndices(index_bytes_ + width_ * begin, static_cast<size_t>(end - begin), width_,
                      out);
    return;
  }
  std::memcpy(out, result_->indices().data() + begin,
              static_cast<size_t>(end - begin) * sizeof(int32_t));
}

std::vector<int32_t> KeptLists::List(int64_t list) const {
  const int64_t begin = offset(list), end = offset(list + 1);
  std::vector<int32_t> out(static_cast<size_t>(end - begin));
  CopyIndices(begin, end, out.data());
  return out;
}

}  // namespace kvtrim

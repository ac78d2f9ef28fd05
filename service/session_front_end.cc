#include "service/session_front_end.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "service/settings_codec.h"

namespace kvtrim::service {

namespace {

using Clock = std::chrono::steady_clock;

void Fail(SessionItem* item, absl::Status status) {
  item->kind = SessionItem::Kind::kError;
  item->status = std::move(status);
}

}  // namespace

void SessionFrontEnd::Process(SessionItem* item) {
  switch (item->kind) {
    case SessionItem::Kind::kBegin:
      return Begin(item);
    case SessionItem::Kind::kLayer:
      return Layer(item);
    case SessionItem::Kind::kFinish:
      if (!begun_) {
        Fail(item, absl::FailedPreconditionError(
                       "finish: received before begin; send begin first"));
      }
      return;
    case SessionItem::Kind::kEmpty:
      return Fail(item, absl::InvalidArgumentError(
                            "message: empty SessionRequest; set begin, layer, finish or "
                            "tensor_chunk"));
    default:
      return;
  }
}

void SessionFrontEnd::Begin(SessionItem* item) {
  if (begun_) {
    return Fail(item, absl::FailedPreconditionError(
                          "begin: the session has already begun; send begin exactly once"));
  }
  const auto start = Clock::now();
  auto settings = DecodeSettings(item->request->begin(), "begin", core_.default_numerics());
  core_.metrics().ObserveStage(Stage::kDecode, SecondsSince(start));
  if (!settings.ok()) return Fail(item, settings.status());
  const auto validate_start = Clock::now();
  auto prepared = core_.PreparePolicy(*settings, "begin");
  core_.metrics().ObserveStage(Stage::kValidate, SecondsSince(validate_start));
  if (!prepared.ok()) return Fail(item, prepared.status());
  policy_ = std::make_shared<const ResolvedPolicy>(*std::move(prepared));
  num_layers_known_ = settings->num_layers > 0;
  begun_ = true;
  item->policy = policy_;
}

void SessionFrontEnd::Layer(SessionItem* item) {
  if (!begun_) {
    return Fail(item, absl::FailedPreconditionError(
                          "layer: received before begin; send begin (the settings) first"));
  }
  core_.metrics().ObserveStage(Stage::kDecode, item->decode_seconds);
  if (!item->status.ok()) return Fail(item, item->status);
  const int32_t id = item->request->layer().layer_id();
  if (!seen_.insert(id).second) {
    return Fail(item, absl::InvalidArgumentError(absl::StrCat(
                          "layer.layer_id: duplicate layer_id ", id, " in this session")));
  }
  // num_layers = 0 means unknown: the layers seen so far define it.
  if (!num_layers_known_ && id > max_layer_id_) {
    auto updated = std::make_shared<ResolvedPolicy>(*policy_);
    updated->settings.num_layers = id + 1;
    policy_ = std::move(updated);
  }
  max_layer_id_ = std::max(max_layer_id_, id);
  item->policy = policy_;
  const auto start = Clock::now();
  auto validated = core_.engine().Validate(*item->policy, item->decoded->request, "layer");
  item->validate_seconds = SecondsSince(start);
  if (!validated.ok()) return Fail(item, validated.status());
  item->validated = std::make_unique<ValidatedLayer>(*std::move(validated));
}

}  // namespace kvtrim::service

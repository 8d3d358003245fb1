// Indexer: placeholder implementation while the real one lands (API only).
#include "indexer/indexer.h"

namespace kvo {

struct Indexer::Impl {
  std::string path;
};

Indexer::Indexer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Indexer::~Indexer() = default;

Result<std::unique_ptr<Indexer>> Indexer::Open(const std::string& path, const IndexerOptions&) {
  return Status::Internal("indexer: Open not implemented yet (" + path + ")");
}
Result<ApplyOutcome> Indexer::ApplyBatch(std::string_view, int64_t, uint64_t, const EventBatch&) {
  return Status::Internal("not implemented yet");
}
Status Indexer::ClearSource(std::string_view) { return Status::Internal("not implemented yet"); }
Result<uint64_t> Indexer::LastSequence(std::string_view, int64_t) const {
  return Status::Internal("not implemented yet");
}
Status Indexer::Flush() { return Status::Internal("not implemented yet"); }
Status Indexer::Compact(int64_t) { return Status::Internal("not implemented yet"); }
Result<ScoreResult> Indexer::Score(const ScoreQuery&) const {
  return Status::Internal("not implemented yet");
}
Result<ExplainResult> Indexer::Explain(const ScoreQuery&) const {
  return Status::Internal("not implemented yet");
}
IndexerStats Indexer::Stats() const { return {}; }
void Indexer::Dump(const std::function<bool(const DumpEntry&)>&) const {}
const std::string& Indexer::path() const { return impl_->path; }

}  // namespace kvo

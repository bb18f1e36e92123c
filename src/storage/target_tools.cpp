// verify_target: the offline scrub behind `fathom store verify`.
#include <filesystem>

#include "storage/chunk_engine.h"
#include "storage/ids.h"
#include "storage/storage.h"

namespace fathom::storage {

Result<TargetReport> verify_target(const std::string& dir) {
  if (!std::filesystem::exists(dir + "/meta/CURRENT")) return not_found("'{}' is not a storage target", dir);
  auto engine = TRY(ChunkEngine::open(EngineParams{.dir = dir}));
  TargetReport r;
  const EngineStats st = engine->stats();
  r.target_id = engine->target_id();
  r.chunks = st.chunks;
  r.live_bytes = st.live_bytes;
  r.orphan_bytes_reclaimed = st.orphan_bytes_reclaimed;
  for (const std::string& id : TRY(engine->scrub())) r.corrupt_ids.push_back(printable_id(id));
  return r;
}

}  // namespace fathom::storage

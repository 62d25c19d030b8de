#include "engine/moment_store.hpp"

#include <unistd.h>

#include <algorithm>

#include "storage/swap_file.hpp"
#include "troupe/check.hpp"

namespace troupe {

namespace {

std::string mib(int64_t bytes) {
  return std::to_string((bytes + (1 << 19)) >> 20) + " MiB";
}

// none and cpu: whole tensors, from the heap or from the host pool.
class MemoryMoments final : public MomentStore {
 public:
  MemoryMoments(const std::vector<int64_t>& counts, DType dtype, HostPool* pool, Device device)
      : pooled_(pool != nullptr), device_(device) {
    for (int64_t n : counts) {
      exp_avg_.push_back(pool ? pool->allocate({n}, dtype) : Tensor::zeros({n}, dtype, device));
      exp_avg_sq_.push_back(pool ? pool->allocate({n}, dtype) : Tensor::zeros({n}, dtype, device));
      bytes_ += 2 * static_cast<int64_t>(exp_avg_.back().nbytes());
    }
  }
  Status visit(MomentAccess, const std::function<void(const MomentPiece&)>& fn) override {
    for (size_t i = 0; i < exp_avg_.size(); ++i) {
      MomentPiece p;
      p.segment = i;
      p.end = exp_avg_[i].numel();
      p.exp_avg = exp_avg_[i];
      p.exp_avg_sq = exp_avg_sq_[i];
      fn(p);
    }
    return Status::ok();
  }
  int64_t resident_bytes() const override { return bytes_; }
  std::string describe() const override {
    return mib(bytes_) + " of Adam moments in " +
           (pooled_ ? "the host memory pool" : device_ == Device::cuda ? "GPU memory" : "memory");
  }

 private:
  bool pooled_;
  Device device_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t bytes_ = 0;
};

int64_t round_up(int64_t bytes) {
  return (bytes + SwapFile::kAlign - 1) / SwapFile::kAlign * SwapFile::kAlign;
}

// nvme: pieces in a swap file, each stored as [exp_avg | exp_avg_sq], both padded to pages.
class SwappedMoments final : public MomentStore {
 public:
  struct Piece {
    size_t segment;
    int64_t begin, end;
    int64_t offset;  // in the file
  };

  static Result<std::unique_ptr<MomentStore>> create(const OptimizerOffload& off,
                                                     const std::vector<int64_t>& counts,
                                                     DType dtype) {
    auto s = std::unique_ptr<SwappedMoments>(new SwappedMoments());
    s->esize_ = static_cast<int64_t>(dtype_size(dtype));
    s->dtype_ = dtype;
    const int64_t piece = off.piece_elements > 0 ? off.piece_elements : kPieceElements;
    int64_t offset = 0, largest = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      for (int64_t b = 0; b < counts[i]; b += piece) {
        const int64_t e = std::min(counts[i], b + piece);
        s->pieces_.push_back({i, b, e, offset});
        offset += 2 * round_up((e - b) * s->esize_);
        largest = std::max(largest, e - b);
      }
    }
    s->moment_bytes_ = offset;
    const std::string name = "troupe-optimizer-rank" + std::to_string(off.rank) + "-pid" +
                             std::to_string(::getpid()) + ".swap";
    auto file = SwapFile::create(off.path, name, offset);
    if (!file) return file.status();
    s->file_ = std::move(file).value();
    s->slot_bytes_ = round_up(largest * s->esize_);
    HostPool local;
    HostPool& pool = off.pool ? *off.pool : local;
    for (int b = 0; b < kBuffers && largest > 0; ++b)
      s->buffers_.push_back(pool.allocate_bytes(2 * s->slot_bytes_));
    return std::unique_ptr<MomentStore>(std::move(s));
  }

  Status visit(MomentAccess access, const std::function<void(const MomentPiece&)>& fn) override {
    const size_t n = pieces_.size();
    std::vector<std::future<Status>> reads(kBuffers), writes(kBuffers);
    Status failure;
    auto keep = [&](std::future<Status>& f) {
      if (!f.valid()) return;
      Status st = f.get();
      if (failure.is_ok() && !st.is_ok()) failure = st;
    };
    auto issue_read = [&](size_t i) {
      const int slot = static_cast<int>(i % kBuffers);
      keep(writes[slot]);  // the slot's previous piece must be on its way out first
      if (access == MomentAccess::write) return;
      const Piece& p = pieces_[i];
      reads[slot] = file_->read(p.offset, buffers_[slot].get(), 2 * padded(p));
    };
    for (size_t i = 0; i < std::min<size_t>(n, kReadAhead); ++i) issue_read(i);
    for (size_t i = 0; i < n && failure.is_ok(); ++i) {
      if (i + kReadAhead < n) issue_read(i + kReadAhead);
      const int slot = static_cast<int>(i % kBuffers);
      keep(reads[slot]);
      if (!failure.is_ok()) break;
      const Piece& p = pieces_[i];
      char* base = static_cast<char*>(buffers_[slot].get());
      const int64_t count = p.end - p.begin;
      MomentPiece piece;
      piece.segment = p.segment;
      piece.begin = p.begin;
      piece.end = p.end;
      piece.exp_avg = Tensor::wrap(base, {count}, dtype_, buffers_[slot]);
      piece.exp_avg_sq = Tensor::wrap(base + padded(p), {count}, dtype_, buffers_[slot]);
      fn(piece);
      if (access != MomentAccess::read) writes[slot] = file_->write(p.offset, base, 2 * padded(p));
    }
    for (auto& f : reads) keep(f);
    for (auto& f : writes) keep(f);
    return failure;
  }

  int64_t resident_bytes() const override {
    return static_cast<int64_t>(buffers_.size()) * 2 * slot_bytes_;
  }
  int64_t file_bytes() const override { return moment_bytes_; }
  std::string describe() const override {
    return mib(moment_bytes_) + " of Adam moments in " + file_->path() + " (deleted on exit; " +
           (file_->direct() ? "O_DIRECT" : "buffered, cache dropped after writes") + "), " +
           std::to_string(buffers_.size()) + " buffers of " + mib(2 * slot_bytes_) + " resident";
  }

 private:
  SwappedMoments() = default;
  int64_t padded(const Piece& p) const { return round_up((p.end - p.begin) * esize_); }

  std::vector<Piece> pieces_;
  std::unique_ptr<SwapFile> file_;
  std::vector<std::shared_ptr<void>> buffers_;
  int64_t esize_ = 4, slot_bytes_ = 0, moment_bytes_ = 0;
  DType dtype_ = DType::f32;
};

}  // namespace

Result<std::unique_ptr<MomentStore>> MomentStore::create(const OptimizerOffload& offload,
                                                         const std::vector<int64_t>& element_counts,
                                                         DType dtype, Device device) {
  TROUPE_CHECK(device == Device::cpu || offload.device == "none", "MomentStore: offloaded moments live on the host");
  if (offload.device == "nvme") return SwappedMoments::create(offload, element_counts, dtype);
  HostPool* pool = nullptr;
  if (offload.device == "cpu") {
    if (!offload.pool)
      return Status::error("--offload-optimizer cpu needs the process's host memory pool");
    pool = offload.pool.get();
  } else if (offload.device != "none") {
    return Status::error("--offload-optimizer is \"" + offload.device +
                         "\" -- use none, cpu or nvme");
  }
  return std::unique_ptr<MomentStore>(new MemoryMoments(element_counts, dtype, pool, device));
}

}  // namespace troupe

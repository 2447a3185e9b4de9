// The host twin: "device" buffers in host memory and a batch as a loop of memcpy, so every
// policy decision and every byte of the data path is tested without a GPU.
#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "pools/backend.h"

namespace ftw::pools {
namespace {

class HostBackend final : public Backend {
public:
    ~HostBackend() override {
        for (void* p : buffers_) std::free(p);
    }
    std::string name() const override { return "host"; }
    uint8_t* alloc(int64_t bytes) override {
        size_t n = static_cast<size_t>((bytes + 255) / 256 * 256);
        void* p = std::aligned_alloc(256, n ? n : 256);
        if (!p) throw Error("host pools: cannot allocate " + std::to_string(bytes) + " bytes");
        std::memset(p, 0, n ? n : 256);
        buffers_.push_back(p);
        return static_cast<uint8_t*>(p);
    }
    const void* source(const void* host, int64_t, const std::string&) override { return host; }
    uint8_t* upload(int64_t bytes) override {
        scratch_.resize(static_cast<size_t>(bytes));
        return scratch_.data();
    }
    void submit(const CopyBatch& batch, int) override {
        for (const auto& op : batch.ops) std::memcpy(op.dst, op.src, static_cast<size_t>(op.bytes));
        last_batch_calls = batch.ops.empty() ? 0 : 1;
        last_kernel_calls = 0;
    }
    void join(int) override {}
    void sync() override {}
    void read(void* dst, const void* src, int64_t bytes) override {
        std::memcpy(dst, src, static_cast<size_t>(bytes));
    }

private:
    std::vector<void*> buffers_;
    std::vector<uint8_t> scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace ftw::pools

#include "core/thread_pool.h"

#include <algorithm>

namespace ftw {

ThreadPool::ThreadPool(int threads) {
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
    for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) {
        try {
            (*fn_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lk(error_mu_);
            if (!error_) error_ = std::current_exception();
            next_.store(n_, std::memory_order_relaxed);  // stop handing out work
        }
    }
}

void ThreadPool::worker() {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
        }
        run_tasks();
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (--active_ == 0) done_.notify_one();
        }
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
    if (n <= 0) return;
    std::lock_guard<std::mutex> call(call_mu_);
    if (workers_.empty() || n == 1) {
        for (int64_t i = 0; i < n; ++i) fn(i);
        return;
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        fn_ = &fn;
        n_ = n;
        next_.store(0, std::memory_order_relaxed);
        error_ = nullptr;
        active_ = int(workers_.size());
        ++generation_;
    }
    wake_.notify_all();
    run_tasks();
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
}

}  // namespace ftw

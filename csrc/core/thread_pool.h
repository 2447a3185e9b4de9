// A fixed pool of worker threads that run one parallel loop at a time. The calling thread
// takes part, so ThreadPool(1) runs everything inline. Tasks are handed out one index at a
// time from an atomic counter (experts and row blocks differ in cost). The first exception a
// task throws is rethrown in the caller after the loop has drained.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ftw {

class ThreadPool {
public:
    explicit ThreadPool(int threads);  // threads in all, the caller included; <= 0: hardware
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // fn(i) for every i in [0, n); returns when all are done. One loop at a time: concurrent
    // callers wait for each other.
    void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

private:
    void worker();
    void run_tasks();

    std::vector<std::thread> workers_;
    std::mutex call_mu_;  // one parallel_for at a time
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(int64_t)>* fn_ = nullptr;
    int64_t n_ = 0;
    std::atomic<int64_t> next_{0};
    int active_ = 0;       // workers still inside the current loop
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
    std::mutex error_mu_;
};

}  // namespace ftw

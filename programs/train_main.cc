// pscore-train: the demo job's worker. Trains logistic regression with synchronous SGD
// on a deterministic synthetic data set whose generating weights w* are known, through
// Push/Pull on the job's servers (which run --update_rule=sgd). Prints one progress line
// per step and ends comparing the final loss and accuracy with those of w*.
// With --scale_out_at=STEP, worker rank 0 asks the scheduler for one more server right
// after that step's barrier (the operator, e.g. scripts/demo.sh, starts the process); the
// next Push/Pull of every worker holds until the cluster is READY again, so synchronous
// SGD ends with the same weights as without the scale-out.
// A worker restarted with its node id resumes the step its predecessor was in (the barrier
// rounds it joined, from the scheduler; the push ids of a step are the same in every
// process, so a redone push is applied once): docs/reliability.md, "Redoing a step".
// Exit codes (programs/exit_codes.h): 0 converged; 1 runtime error or no convergence; 2 bad
// flags; 3 the job failed; 4 the scheduler was lost.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>

#include <gflags/gflags.h>

#include "pscore/node/common/admin_client.h"
#include "programs/exit_codes.h"
#include "programs/flags.h"
#include "pscore/node/common/tls_reloader.h"
#include "pscore/node/worker/worker_node.h"

namespace {

using namespace pscore;
using namespace std::chrono_literals;

struct DataSet {
  int dim = 0;
  std::vector<float> x;  // samples x dim
  std::vector<float> y;  // 0 or 1
  std::vector<float> w_star;
  size_t size() const { return y.size(); }
};

// Same seed, same data on every worker; each worker then trains on its own shard.
DataSet MakeData(const node::TrainOptions& t) {
  DataSet d;
  d.dim = t.dim;
  std::mt19937_64 rng(t.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  d.w_star.resize(t.dim);
  for (auto& w : d.w_star) w = 3.0f * normal(rng) / std::sqrt(static_cast<float>(t.dim));
  d.x.resize(static_cast<size_t>(t.samples) * t.dim);
  d.y.resize(t.samples);
  for (int i = 0; i < t.samples; ++i) {
    float z = 0;
    for (int j = 0; j < t.dim; ++j) {
      float v = normal(rng);
      d.x[static_cast<size_t>(i) * t.dim + j] = v;
      z += v * d.w_star[j];
    }
    d.y[i] = uniform(rng) < 1.0f / (1.0f + std::exp(-z)) ? 1.0f : 0.0f;
  }
  return d;
}

struct Eval {
  double loss = 0;
  double accuracy = 0;
};

// Mean log-loss and accuracy over samples [begin, end) with stride; optional gradient sum.
Eval Evaluate(const DataSet& d, const std::vector<float>& w, size_t begin, size_t stride,
              std::vector<double>* grad) {
  Eval e;
  size_t n = 0;
  for (size_t i = begin; i < d.size(); i += stride, ++n) {
    const float* xi = &d.x[i * d.dim];
    double z = 0;
    for (int j = 0; j < d.dim; ++j) z += static_cast<double>(xi[j]) * w[j];
    double p = 1.0 / (1.0 + std::exp(-z));
    double y = d.y[i];
    e.loss += -(y * std::log(std::max(p, 1e-12)) + (1 - y) * std::log(std::max(1 - p, 1e-12)));
    e.accuracy += ((p >= 0.5) == (y == 1.0)) ? 1 : 0;
    if (grad != nullptr) {
      for (int j = 0; j < d.dim; ++j) (*grad)[j] += (p - y) * xi[j];
    }
  }
  e.loss /= std::max<size_t>(n, 1);
  e.accuracy /= std::max<size_t>(n, 1);
  return e;
}

// Asks the scheduler for one more server (same workers) and returns once it accepted the
// operation; the new server registers when the operator starts it.
Status RequestOneMoreServer(const node::NodeOptions& opts, int workers, int servers) {
  node::AdminClientOptions ao;
  ao.scheduler_host = opts.scheduler_host;
  ao.scheduler_port = opts.scheduler_port;
  ao.cluster_token = opts.cluster_token;
  ao.tls = opts.tls;
  ao.timeout = 10s;
  node::AdminClient admin(ao);
  PSCORE_RETURN_IF_ERROR(admin.Connect());
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(workers);
  req.set_server_num(servers + 1);
  Result<pb::AdminResponse> r = admin.Admin(req);
  if (!r.ok()) return Status(r.status().code(), "scale-out request refused: " + r.status().message());
  std::printf("worker 0 asked for a scale-out to %d servers (membership version %llu)\n", servers + 1,
              static_cast<unsigned long long>(r->epoch()));
  std::fflush(stdout);
  return Status::Ok();
}

// The pushes of step `step` carry seqs from here on (init: 0): a restarted worker redoing
// a step sends the ids its predecessor sent. Room for kSeqsPerStep server parts per push.
constexpr uint64_t kSeqsPerStep = 4096;

// The push incarnation of one worker id: the same for every process that runs as it.
uint64_t StableIncarnation(const std::string& node_id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : "pscore-train/" + node_id) h = (h ^ c) * 1099511628211ull;
  return h | 1;
}

// The weights a worker pulled for a step, kept in the scheduler's KV store before the step's
// "pulled" barrier: a restarted worker that had passed that barrier recomputes its gradient
// from them. | step u64 | floats |, host byte order (the same binary reads it back).
std::string EncodePulled(uint64_t step, const std::vector<float>& w) {
  std::string out(sizeof(step) + w.size() * sizeof(float), '\0');
  std::memcpy(out.data(), &step, sizeof(step));
  if (!w.empty()) std::memcpy(out.data() + sizeof(step), w.data(), w.size() * sizeof(float));
  return out;
}

Result<std::vector<float>> DecodePulled(const std::string& bytes, uint64_t step, int dim) {
  uint64_t got = 0;
  if (bytes.size() != sizeof(got) + static_cast<size_t>(dim) * sizeof(float)) {
    return Status(Code::kInternal, "stored weights of " + std::to_string(bytes.size()) + " bytes");
  }
  std::memcpy(&got, bytes.data(), sizeof(got));
  if (got != step) {
    return Status(Code::kInternal, "stored weights are of step " + std::to_string(got) + ", not " +
                                       std::to_string(step));
  }
  std::vector<float> w(dim);
  std::memcpy(w.data(), bytes.data() + sizeof(got), w.size() * sizeof(float));
  return w;
}

// Where a worker process starts: 0 rounds for a fresh one; a restarted one (same node id)
// the rounds of its barriers its predecessor joined (docs/reliability.md, "Redoing a step").
struct Resume {
  uint64_t init = 0;    // train/init rounds joined (1: the job had started)
  uint64_t pulled = 0;  // steps whose "pulled" barrier was joined
  uint64_t step = 0;    // steps completed (their "step" barrier joined)
};

Result<Resume> FindResume(node::WorkerNode* worker) {
  Resume r;
  for (auto [id, out] : {std::pair<const char*, uint64_t*>{"train/init", &r.init},
                         {"train/pulled", &r.pulled},
                         {"train/step", &r.step}}) {
    Result<uint64_t> round = worker->ResumeBarrierRound(id);
    if (!round.ok()) return round.status();
    *out = *round;
  }
  if (r.pulled < r.step || r.pulled > r.step + 1) {
    return Status(Code::kInternal, "inconsistent barrier rounds: pulled " + std::to_string(r.pulled) + ", step " +
                                       std::to_string(r.step));
  }
  return r;
}

int Train(const node::CommandLine& cl) {
  const node::TrainOptions& t = cl.train;
  node::NodeOptions opts = cl.node;
  node::WorkerNode worker(opts);
  Status st = worker.Start();
  if (st.ok()) st = worker.WaitForReady(opts.connect_timeout);
  Result<Resume> resume = st.ok() ? FindResume(&worker) : Result<Resume>(st);
  if (!resume.ok()) {
    std::cerr << "pscore-train: " << resume.status() << std::endl;
    return node::MemberExitCode(resume.status()) == node::kExitFinished ? node::kExitError
                                                                          : node::MemberExitCode(resume.status());
  }
  const int rank = worker.rank();
  const int workers = worker.metadata().worker_num();
  DataSet data = MakeData(t);
  std::vector<uint64_t> keys(t.keys);
  for (int k = 0; k < t.keys; ++k) keys[k] = k;
  std::vector<uint32_t> lens(t.keys, t.dim / t.keys);
  lens.back() += t.dim % t.keys;
  size_t shard = (data.size() + workers - 1 - rank) / workers;
  const uint64_t incarnation = StableIncarnation(worker.node_id());
  const std::string pulled_key = "train/w/" + worker.node_id();
  const std::vector<std::string> peers = worker.NodeIds(pb::WORKER);

  if (resume->init == 0) {
    // Step 0: every worker pushes a zero gradient so the keys exist (initial w = 0).
    std::vector<float> zeros(t.dim, 0.0f);
    worker.SetPushIds(incarnation, 1);
    st = worker.Push(keys, zeros, lens).get();
    if (st.ok()) st = worker.Barrier("train/init", 60s, peers);
  } else {
    std::printf("worker %d restarted: resumes after step %llu%s\n", rank,
                static_cast<unsigned long long>(resume->step),
                resume->pulled > resume->step ? " (redoing the push of the next step)" : "");
    std::fflush(stdout);
  }
  std::vector<float> w(t.dim, 0.0f);
  const int first = static_cast<int>(resume->step) + 1;
  for (int step = first; st.ok() && step <= t.steps; ++step) {
    auto started = std::chrono::steady_clock::now();
    // The predecessor passed this step's "pulled" barrier: every worker pulled the step's
    // weights, and the servers may hold some pushes of it already; the weights it pulled
    // are in the KV store.
    const bool redo = step == first && resume->pulled == static_cast<uint64_t>(step);
    if (redo) {
      Result<std::string> stored = worker.KvTryGet(pulled_key);
      Result<std::vector<float>> prev =
          stored.ok() ? DecodePulled(*stored, step, t.dim) : Result<std::vector<float>>(stored.status());
      if (!prev.ok()) {
        st = Status(prev.status().code(), "resuming step " + std::to_string(step) + ": " + prev.status().message());
        break;
      }
      w = std::move(*prev);
    } else {
      Result<node::PullResult> pulled = worker.Pull(keys).get();
      if (!pulled.ok()) {
        st = pulled.status();
        break;
      }
      w = pulled->values;
      st = worker.KvSet(pulled_key, EncodePulled(step, w));
      if (!st.ok()) break;
    }
    std::vector<double> grad(t.dim, 0.0);
    Eval e = Evaluate(data, w, rank, workers, &grad);
    // Each worker's share of the full-batch mean gradient; the servers sum the pushes.
    std::vector<float> g(t.dim);
    for (int j = 0; j < t.dim; ++j) g[j] = static_cast<float>(grad[j] / data.size());
    // Synchronous: no worker pushes step `step` before every worker pulled for it (a fast
    // worker's push would otherwise leak into a slow worker's pull of the same step).
    if (!redo) st = worker.Barrier("train/pulled", 60s, peers);
    // The same push ids in every process that pushes this step as this worker.
    worker.SetPushIds(incarnation, static_cast<uint64_t>(step) * kSeqsPerStep + 1);
    if (st.ok()) st = worker.Push(keys, g, lens).get();
    if (st.ok()) st = worker.Barrier("train/step", 60s, peers);
    // Every push of this step is acknowledged: the scale-out moves finished parameters.
    if (st.ok() && step == t.scale_out_at && rank == 0) {
      st = RequestOneMoreServer(opts, workers, worker.server_count());
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf("worker %d step %3d loss %.5f acc %.4f throughput %.0f samples/s\n", rank, step, e.loss,
                e.accuracy, shard / std::max(secs, 1e-9));
    std::fflush(stdout);
  }
  if (st.ok()) {
    Result<node::PullResult> pulled = worker.Pull(keys).get();
    st = pulled.status();
    if (st.ok()) w = pulled->values;
  }
  if (!st.ok()) {
    std::cerr << "pscore-train: worker " << rank << ": " << st << std::endl;
    // Honest outcome: this worker's part is not done. Reported as an error and followed by
    // Finish, the job ends failed naming it (or the peer whose loss stopped it) instead of
    // waiting for a worker that will never finish; 3 once the scheduler says so.
    Status end = worker.WaitForTermination(0s);
    if (end.code() != Code::kAborted && end.code() != Code::kUnavailable) {
      worker.ReportError(static_cast<int>(st.code()), st.message()).IgnoreError();
      end = worker.Finish(60s);
      if (!end.ok()) std::cerr << "pscore-train: finish: " << end << std::endl;
    }
    worker.Stop();
    if (end.code() == Code::kAborted) return node::kExitJobFailed;
    const int code = node::MemberExitCode(st);
    return code == node::kExitFinished || code == node::kExitJobFailed ? node::kExitError : code;
  }
  Eval final_eval = Evaluate(data, w, 0, 1, nullptr);
  Eval optimum = Evaluate(data, data.w_star, 0, 1, nullptr);
  double checksum = 0;
  for (float v : w) checksum += v;
  std::printf("worker %d final loss %.5f acc %.4f | generating weights w*: loss %.5f acc %.4f | gap %+.5f | "
              "weights checksum %.9f\n",
              rank, final_eval.loss, final_eval.accuracy, optimum.loss, optimum.accuracy,
              final_eval.loss - optimum.loss, checksum);
  std::fflush(stdout);
  st = worker.Finish(120s);
  if (!st.ok()) std::cerr << "pscore-train: finish: " << st << std::endl;
  worker.Stop();
  if (!st.ok()) {
    const int code = node::MemberExitCode(st);
    return code == node::kExitFinished ? node::kExitError : code;
  }
  // Converged: within 0.01 of the loss of the generating weights (the MLE on the
  // training set can only be lower).
  bool converged = final_eval.loss <= optimum.loss + 0.01;
  if (!converged) std::cerr << "pscore-train: did not converge" << std::endl;
  return converged ? node::kExitFinished : node::kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  node::CommandLine cl = node::ParseFlags(
      &argc, &argv,
      "Demo worker: logistic regression by synchronous SGD over pscore Push/Pull.\n"
      "  pscore-train --scheduler_port=P [--steps=60 --samples=20000 --dim=64 --keys=8]",
      node::Program::kTrain);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  cl.node.role = pb::WORKER;
  node::TlsReloader reloader(cl.node.tls);  // SIGHUP: new links use the TLS files read again
  return Train(cl);
}

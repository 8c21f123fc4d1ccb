// pscore-train: the demo job's worker. Trains logistic regression with synchronous SGD
// on a deterministic synthetic data set whose generating weights w* are known, through
// Push/Pull on the job's servers (which run --update_rule=sgd). Prints one progress line
// per step and ends comparing the final loss and accuracy with those of w*.
// With --scale_out_at=STEP, worker rank 0 asks the scheduler for one more server right
// after that step's barrier (the operator, e.g. scripts/demo.sh, starts the process); with
// --scale_in_at=STEP, for one server fewer (the highest rank leaves and exits 0). The next
// Push/Pull of every worker holds until the cluster is READY again, so synchronous SGD
// ends with the same weights as without the scale.
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
#include "pscore/node/common/admin_ops.h"
#include "pscore/node/common/tls_reloader.h"
#include "pscore/node/worker/worker_node.h"
#include "programs/exit_codes.h"
#include "programs/flags.h"

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

// Asks the scheduler for one server more (scale-out) or one fewer (scale-in: the highest
// rank leaves), the same workers, and returns once it accepted the operation. A new server
// registers when the operator starts it; a leaving one exits 0 when the scale-in ends.
Status RequestServerCount(const node::NodeOptions& opts, int workers, int servers, int delta) {
  const node::AdminOp op = delta > 0 ? node::AdminOp::kScaleOut : node::AdminOp::kScaleIn;
  node::AdminClientOptions ao;
  ao.scheduler_host = opts.scheduler_host;
  ao.scheduler_port = opts.scheduler_port;
  ao.cluster_token = opts.cluster_token;
  ao.tls = opts.tls;
  ao.timeout = 10s;
  node::AdminClient admin(ao);
  PSCORE_RETURN_IF_ERROR(admin.Connect());
  pb::AdminRequest req;
  req.set_op(node::AdminOpName(op));
  req.set_worker_num(workers);
  req.set_server_num(servers + delta);
  Result<pb::AdminResponse> r = admin.Admin(req);
  const char* what = delta > 0 ? "scale-out" : "scale-in";
  if (!r.ok()) return Status(r.status().code(), std::string(what) + " request refused: " + r.status().message());
  std::printf("worker 0 asked for a %s to %d servers (membership version %llu)\n", what, servers + delta,
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

// One worker's training run: the job's data and key layout, and the steps from where the
// process starts (a restarted worker resumes) to the end. Main thread.
class Trainer {
 public:
  Trainer(const node::CommandLine& cl, node::WorkerNode* worker, const Resume& resume);

  // Every step, then the final pull into w_.
  Status Run();

  // The job ends failed (3), this worker's part is not done (1), or the scheduler was lost (4).
  int Failed(const Status& st);

  // Prints the final line, joins the finish barrier, and says whether training converged.
  int Finished();

 private:
  // Step 0 of a fresh worker: a zero gradient pushed so the keys exist (initial w = 0).
  Status Begin();

  // The weights of `step` into w_: pulled (and kept in the KV store), or, when `redo`,
  // the ones the predecessor pulled, read back from the KV store.
  Status LoadWeights(int step, bool redo);

  Status Step(int step, int first);

  const node::TrainOptions& t_;
  const node::NodeOptions& opts_;
  node::WorkerNode& worker_;
  const Resume resume_;
  int rank_ = 0;
  int workers_ = 1;
  DataSet data_;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> lens_;
  size_t shard_ = 0;
  uint64_t incarnation_ = 0;
  std::string pulled_key_;
  std::vector<std::string> peers_;
  std::vector<float> w_;  // the weights of the current step, then the final ones
};

Trainer::Trainer(const node::CommandLine& cl, node::WorkerNode* worker, const Resume& resume)
    : t_(cl.train), opts_(cl.node), worker_(*worker), resume_(resume) {
  rank_ = worker_.rank();
  workers_ = worker_.metadata().worker_num();
  data_ = MakeData(t_);
  keys_.resize(t_.keys);
  for (int k = 0; k < t_.keys; ++k) keys_[k] = k;
  lens_.assign(t_.keys, t_.dim / t_.keys);
  lens_.back() += t_.dim % t_.keys;
  shard_ = (data_.size() + workers_ - 1 - rank_) / workers_;
  incarnation_ = StableIncarnation(worker_.node_id());
  pulled_key_ = "train/w/" + worker_.node_id();
  peers_ = worker_.NodeIds(pb::WORKER);
}

Status Trainer::Run() {
  Status st = Begin();
  const int first = static_cast<int>(resume_.step) + 1;
  for (int step = first; st.ok() && step <= t_.steps; ++step) st = Step(step, first);
  if (st.ok()) {
    Result<node::PullResult> pulled = worker_.Pull(keys_).get();
    st = pulled.status();
    if (st.ok()) w_ = pulled->values;
  }
  return st;
}

int Trainer::Failed(const Status& st) {
  std::cerr << "pscore-train: worker " << rank_ << ": " << st << std::endl;
  // Honest outcome: this worker's part is not done. Reported as an error and followed by
  // Finish, the job ends failed naming it (or the peer whose loss stopped it) instead of
  // waiting for a worker that will never finish; 3 once the scheduler says so.
  Status end = worker_.WaitForTermination(0s);
  if (end.code() != Code::kAborted && end.code() != Code::kUnavailable) {
    worker_.ReportError(static_cast<int>(st.code()), st.message()).IgnoreError();
    end = worker_.Finish(60s);
    if (!end.ok()) std::cerr << "pscore-train: finish: " << end << std::endl;
  }
  worker_.Stop();
  if (end.code() == Code::kAborted) return node::kExitJobFailed;
  const int code = node::MemberExitCode(st);
  return code == node::kExitFinished || code == node::kExitJobFailed ? node::kExitError : code;
}

int Trainer::Finished() {
  Eval final_eval = Evaluate(data_, w_, 0, 1, nullptr);
  Eval optimum = Evaluate(data_, data_.w_star, 0, 1, nullptr);
  double checksum = 0;
  for (float v : w_) checksum += v;
  std::printf("worker %d final loss %.5f acc %.4f | generating weights w*: loss %.5f acc %.4f | gap %+.5f | "
              "weights checksum %.9f\n",
              rank_, final_eval.loss, final_eval.accuracy, optimum.loss, optimum.accuracy,
              final_eval.loss - optimum.loss, checksum);
  std::fflush(stdout);
  Status st = worker_.Finish(120s);
  if (!st.ok()) std::cerr << "pscore-train: finish: " << st << std::endl;
  worker_.Stop();
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

Status Trainer::Begin() {
  if (resume_.init == 0) {
    std::vector<float> zeros(t_.dim, 0.0f);
    worker_.SetPushIds(incarnation_, 1);
    Status st = worker_.Push(keys_, zeros, lens_).get();
    if (st.ok()) st = worker_.Barrier("train/init", 60s, peers_);
    return st;
  }
  std::printf("worker %d restarted: resumes after step %llu%s\n", rank_,
              static_cast<unsigned long long>(resume_.step),
              resume_.pulled > resume_.step ? " (redoing the push of the next step)" : "");
  std::fflush(stdout);
  return Status::Ok();
}

Status Trainer::LoadWeights(int step, bool redo) {
  if (redo) {
    Result<std::string> stored = worker_.KvTryGet(pulled_key_);
    Result<std::vector<float>> prev =
        stored.ok() ? DecodePulled(*stored, step, t_.dim) : Result<std::vector<float>>(stored.status());
    if (!prev.ok()) {
      return Status(prev.status().code(), "resuming step " + std::to_string(step) + ": " + prev.status().message());
    }
    w_ = std::move(*prev);
    return Status::Ok();
  }
  Result<node::PullResult> pulled = worker_.Pull(keys_).get();
  if (!pulled.ok()) return pulled.status();
  w_ = pulled->values;
  return worker_.KvSet(pulled_key_, EncodePulled(step, w_));
}

Status Trainer::Step(int step, int first) {
  auto started = std::chrono::steady_clock::now();
  // The predecessor passed this step's "pulled" barrier: every worker pulled the step's
  // weights, and the servers may hold some pushes of it already; the weights it pulled
  // are in the KV store.
  const bool redo = step == first && resume_.pulled == static_cast<uint64_t>(step);
  Status st = LoadWeights(step, redo);
  if (!st.ok()) return st;
  std::vector<double> grad(t_.dim, 0.0);
  Eval e = Evaluate(data_, w_, rank_, workers_, &grad);
  // Each worker's share of the full-batch mean gradient; the servers sum the pushes.
  std::vector<float> g(t_.dim);
  for (int j = 0; j < t_.dim; ++j) g[j] = static_cast<float>(grad[j] / data_.size());
  // Synchronous: no worker pushes step `step` before every worker pulled for it (a fast
  // worker's push would otherwise leak into a slow worker's pull of the same step).
  if (!redo) st = worker_.Barrier("train/pulled", 60s, peers_);
  // The same push ids in every process that pushes this step as this worker.
  worker_.SetPushIds(incarnation_, static_cast<uint64_t>(step) * kSeqsPerStep + 1);
  if (st.ok()) st = worker_.Push(keys_, g, lens_).get();
  if (st.ok()) st = worker_.Barrier("train/step", 60s, peers_);
  // Every push of this step is acknowledged: the scale moves finished parameters.
  if (st.ok() && step == t_.scale_out_at && rank_ == 0) {
    st = RequestServerCount(opts_, workers_, worker_.server_count(), +1);
  }
  if (st.ok() && step == t_.scale_in_at && rank_ == 0) {
    st = RequestServerCount(opts_, workers_, worker_.server_count(), -1);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("worker %d step %3d loss %.5f acc %.4f throughput %.0f samples/s\n", rank_, step, e.loss,
              e.accuracy, shard_ / std::max(secs, 1e-9));
  std::fflush(stdout);
  return st;
}

int Train(const node::CommandLine& cl) {
  node::WorkerNode worker(cl.node);
  Status st = worker.Start();
  if (st.ok()) st = worker.WaitForReady(cl.node.connect_timeout);
  Result<Resume> resume = st.ok() ? FindResume(&worker) : Result<Resume>(st);
  if (!resume.ok()) {
    std::cerr << "pscore-train: " << resume.status() << std::endl;
    return node::MemberExitCode(resume.status()) == node::kExitFinished ? node::kExitError
                                                                          : node::MemberExitCode(resume.status());
  }
  Trainer trainer(cl, &worker, *resume);
  st = trainer.Run();
  return st.ok() ? trainer.Finished() : trainer.Failed(st);
}

}  // namespace

int main(int argc, char** argv) {
  node::CommandLine cl = node::ParseTrainFlags(
      &argc, &argv,
      "Demo worker: logistic regression by synchronous SGD over pscore Push/Pull.\n"
      "  pscore-train --scheduler_port=P [--steps=60 --samples=20000 --dim=64 --keys=8]");
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  cl.node.role = pb::WORKER;
  node::TlsReloader reloader(cl.node.tls);  // SIGHUP: new links use the TLS files read again
  return Train(cl);
}

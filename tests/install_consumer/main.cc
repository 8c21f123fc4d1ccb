// An embedding program built against the installed pscore package: it starts a
// scheduler, one server and one worker in this process on 127.0.0.1 (free ports), pushes
// and pulls a tensor, calls a named handler, finishes the job and exits 0 on success.
#include <cstdio>
#include <future>
#include <vector>

#include <pscore/node/scheduler/scheduler_node.h>
#include <pscore/node/server/server_node.h>
#include <pscore/node/worker/worker_node.h>

using namespace std::chrono_literals;
using pscore::Buffer;
using pscore::node::DataRequest;
using pscore::node::Responder;

int Fail(const char* what, const pscore::Status& st) {
  std::fprintf(stderr, "pscore_consumer: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

int main() {
  pscore::node::SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 1;
  pscore::node::SchedulerNode scheduler(so);
  if (auto st = scheduler.Start(); !st.ok()) return Fail("scheduler start", st);

  pscore::node::NodeOptions no;
  no.scheduler_port = scheduler.port();
  no.connect_timeout = 10s;
  pscore::node::ServerNode server(no);
  server.RegisterHandler("hello", [](const DataRequest& req, Responder r) {
    r.Reply(Buffer::FromString("hello, " + std::string(req.payload->view())));
  });
  pscore::node::WorkerNode worker(no);
  if (auto st = server.Start(); !st.ok()) return Fail("server start", st);
  if (auto st = worker.Start(); !st.ok()) return Fail("worker start", st);
  if (auto st = worker.WaitForReady(20s); !st.ok()) return Fail("ready", st);

  auto push = worker.Push({1, 2}, {1.5f, 2.5f, 3.5f, 4.5f});
  if (push.wait_for(20s) != std::future_status::ready) return Fail("push", pscore::Status(pscore::Code::kTimeout, ""));
  if (auto st = push.get(); !st.ok()) return Fail("push", st);
  auto pull = worker.Pull({2, 1});
  if (pull.wait_for(20s) != std::future_status::ready) return Fail("pull", pscore::Status(pscore::Code::kTimeout, ""));
  auto pulled = pull.get();
  if (!pulled.ok()) return Fail("pull", pulled.status());
  if (pulled->values != std::vector<float>{3.5f, 4.5f, 1.5f, 2.5f}) {
    return Fail("pull", pscore::Status(pscore::Code::kInternal, "unexpected values"));
  }
  auto call = worker.Call(0, "hello", Buffer::FromString("consumer"));
  if (call.wait_for(20s) != std::future_status::ready) return Fail("call", pscore::Status(pscore::Code::kTimeout, ""));
  auto answer = call.get();
  if (!answer.ok()) return Fail("call", answer.status());

  auto server_done = std::async(std::launch::async, [&] { return server.Finish(20s); });
  if (auto st = worker.Finish(20s); !st.ok()) return Fail("finish", st);
  if (auto st = server_done.get(); !st.ok()) return Fail("server finish", st);
  worker.Stop();
  server.Stop();
  scheduler.Stop();
  std::printf("pscore_consumer ok: %s\n", std::string((*answer)->view()).c_str());
  return 0;
}

// pscore.Server: a parameter server whose handlers may be Python functions.
#include <memory>

#include "binding.h"
#include "py_node.h"

namespace pscore::python {
namespace {

// Server handlers run on the server's executor threads, which take the GIL for the
// Python function only.
node::DataHandler PythonHandler(py::function fn) {
  std::shared_ptr<py::function> f(new py::function(std::move(fn)), [](py::function* p) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [f](const node::DataRequest& req, node::Responder r) {
    if (!Py_IsInitialized()) return r.Fail(Status(Code::kUnavailable, "python is shutting down"));
    Status failed;
    std::string answer;
    {
      py::gil_scoped_acquire gil;
      try {
        py::bytes payload = req.payload ? py::bytes(reinterpret_cast<const char*>(req.payload->data()),
                                                    req.payload->size())
                                        : py::bytes("");
        py::object out = (*f)(payload, req.from_rank);
        if (!out.is_none()) answer = py::bytes(out);
      } catch (py::error_already_set& e) {
        Code code = Code::kInternal;
        if (e.matches(ErrorBase())) {
          py::object c = e.value().attr("code");
          if (!c.is_none()) code = CodeFromInt(c.cast<int>());
        }
        failed = Status(code, std::string("python handler: ") + e.what());
      } catch (std::exception& e) {
        failed = Status(Code::kInternal, std::string("python handler: ") + e.what());
      }
    }
    if (!failed.ok()) return r.Fail(failed);
    r.Reply(Buffer::FromString(answer));
  };
}

core::ParamStore::Options StoreOpts(const std::string& rule, float learning_rate) {
  core::ParamStore::Options s;
  if (rule == "sum") s.rule = core::UpdateRule::kSum;
  else if (rule == "sgd") s.rule = core::UpdateRule::kSgd;
  else if (rule == "assign") s.rule = core::UpdateRule::kAssign;
  else Raise(Status(Code::kInvalidArgument, "rule must be sum, sgd or assign, not '" + rule + "'"));
  s.learning_rate = learning_rate;
  return s;
}

}  // namespace

void BindServer(py::module_& m) {
  py::class_<PyServer> server(m, "Server");
  server.def(py::init([](const std::string& rule, float learning_rate, py::kwargs kw) {
           node::NodeOptions o;
           o.role = pb::SERVER;
           ApplyNodeOptions(o, kw);
           auto s = std::make_unique<PyServer>();
           s->node = std::make_unique<node::ServerNode>(o, StoreOpts(rule, learning_rate));
           s->node->SetCallbacks(QueueCallbacks(s->events));
           return s;
         }), py::arg("rule") = "sum", py::arg("learning_rate") = 0.01f)
      .def("register_handler", [](PyServer& s, const std::string& name, py::function fn) {
        s.get().RegisterHandler(name, PythonHandler(std::move(fn)));
      }, py::arg("name"), py::arg("fn"))
      .def_property_readonly("streamed_pushes", [](PyServer& s) { return s.get().streamed_pushes(); });
  BindNodeCommon(server);
}

}  // namespace pscore::python

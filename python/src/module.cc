// pscore._pscore: the Python binding. A thin layer over the C++ API (docs/embedding.md,
// docs/python.md): every blocking call releases the GIL and waits in slices, checking for
// signals (Ctrl-C) between them with the GIL held; float arrays cross through the buffer
// protocol without a copy between the caller's memory and the C++ calls. Each class group
// is bound in a file of its own (binding.h lists them).
#include "binding.h"

PYBIND11_MODULE(_pscore, m) {
  using namespace pscore::python;
  m.doc() = "pscore: the C++ parameter-server core (binding; use the pscore package)";
  BindErrors(m);
  BindScheduler(m);
  BindServer(m);
  BindWorker(m);
  BindRankTables(m);
  BindAdminClient(m);
}

#include "programs/common_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <vector>

#include "pscore/comm/tls.h"
#include "pscore/node/common/wire.h"
#include "programs/exit_codes.h"

#ifndef PSCORE_VERSION
#error "PSCORE_VERSION (the CMake project's version) must be defined"
#endif

DEFINE_string(scheduler_host, "127.0.0.1", "Scheduler address (numeric IP or localhost).");
DEFINE_int32(scheduler_port, 0, "Scheduler port. The scheduler binds it (0: a free port, see --port_file).");
DEFINE_uint64(max_message_bytes, 256ull << 20, "Largest frame payload accepted or sent.");
DEFINE_string(tls_cert, "", "PEM certificate of this process, signed by --tls_ca. With --tls_key and --tls_ca it turns "
              "on TLS 1.3 with mutual authentication on every link and on the HTTP port (HTTPS). Its subject CN "
              "names the process: a member's --node_id, 'scheduler' for the scheduler, 'admin' for operators.");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert.");
DEFINE_string(tls_ca, "", "PEM certificate of the cluster CA: every peer must present a certificate it signed.");
DEFINE_string(cluster_token_file, "", "File holding the cluster token (trailing whitespace ignored). Every process of the job "
              "must use the same token; connections and admin commands then prove it with an HMAC.");

DECLARE_bool(help);

namespace pscore::node::flags {
namespace {

// A flag of ours (programs/<name>_flags.cc), as opposed to one of gflags' or glog's.
bool DefinedHere(const gflags::CommandLineFlagInfo& info) {
  const std::string& f = info.filename;
  const std::string tail = "_flags.cc";
  return f.find("programs/") != std::string::npos && f.size() >= tail.size() &&
         f.compare(f.size() - tail.size(), tail.size(), tail) == 0;
}

// --help: the usage text, then the program's own flags by name (gflags' ShowUsage would
// list glog's flags too).
[[noreturn]] void ShowHelp(const char* usage) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::cout << usage << "\n\n  Flags:\n";
  for (const auto& f : all) {
    if (DefinedHere(f)) std::cout << gflags::DescribeOneFlag(f);
  }
  std::cout << "\n(--helpfull also lists glog's logging flags)" << std::endl;
  std::exit(kExitFinished);
}

// gflags would exit 1 on an unknown flag or a value of the wrong type; bad flags exit 2
// here, with one line. A value is tried on the flag itself (gflags sets it again later).
void RefuseBadFlags(const std::string& prog, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    std::string name = a.substr(a.find_first_not_of('-'));
    const size_t eq = name.find('=');
    std::optional<std::string> value;
    if (eq != std::string::npos) value = name.substr(eq + 1);
    name = name.substr(0, eq);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      if (name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
          info.type == "bool" && !value) {
        continue;
      }
      Die(prog, "unknown flag " + a + " (see --help)");
    }
    if (!value && info.type != "bool" && i + 1 < argc) value = argv[++i];  // --name value (e.g. --rank -1)
    if (value && gflags::SetCommandLineOption(name.c_str(), value->c_str()).empty()) {
      Die(prog, "bad value '" + *value + "' for --" + name + " (" + info.type + ")");
    }
  }
}

// PSCORE_<NAME> fills every flag of ours not given on the command line.
void ApplyEnvironment(const std::string& prog) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  for (const auto& f : all) {
    if (!f.is_default || !DefinedHere(f)) continue;
    std::string env = "PSCORE_";
    for (char c : f.name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const char* v = std::getenv(env.c_str());
    if (v == nullptr) continue;
    if (gflags::SetCommandLineOption(f.name.c_str(), v).empty()) {
      Die(prog, "bad value '" + std::string(v) + "' in " + env + " for --" + f.name);
    }
  }
}

}  // namespace

[[noreturn]] void Die(const std::string& prog, const std::string& msg) {
  std::cerr << prog << ": " << msg << std::endl;
  std::exit(kExitUsage);
}

std::string ParseCommandLine(int* argc, char*** argv, const char* usage) {
  std::string prog = (*argc > 0) ? (*argv)[0] : "pscore";
  const size_t slash = prog.rfind('/');
  if (slash != std::string::npos) prog = prog.substr(slash + 1);
  gflags::SetUsageMessage(usage);
  gflags::SetVersionString(PSCORE_VERSION);
  RefuseBadFlags(prog, *argc, *argv);
  gflags::ParseCommandLineNonHelpFlags(argc, argv, true);
  if (FLAGS_help) ShowHelp(usage);  // gflags would list every library's flags and exit 1
  gflags::HandleCommandLineHelpFlags();  // --helpfull, --version, ...
  ApplyEnvironment(prog);
  return prog;
}

bool Given(const char* name) { return !gflags::GetCommandLineFlagInfoOrDie(name).is_default; }

void CheckPort(const std::string& prog, const char* name, int v) {
  if (v < 0 || v > 65535) Die(prog, std::string("--") + name + " must be in [0, 65535] (got " + std::to_string(v) + ")");
}

void CheckMs(const std::string& prog, const char* name, int64_t v, int64_t min) {
  if (v < min || v > kMaxTimeoutMs) {
    Die(prog, std::string("--") + name + " must be in [" + std::to_string(min) + ", " + std::to_string(kMaxTimeoutMs) +
                  "] (got " + std::to_string(v) + ")");
  }
}

void CheckMaxMessageBytes(const std::string& prog) {
  if (FLAGS_max_message_bytes < 1024) Die(prog, "--max_message_bytes must be >= 1024");
}

void LoadSecrets(const std::string& prog, CommandLine* cl) {
  std::string token;
  if (!FLAGS_cluster_token_file.empty()) {
    std::ifstream in(FLAGS_cluster_token_file, std::ios::binary);
    if (!in) Die(prog, "--cluster_token_file: cannot read " + FLAGS_cluster_token_file);
    token.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    if (token.empty()) Die(prog, "--cluster_token_file: " + FLAGS_cluster_token_file + " is empty");
  }
  cl->cluster_token = token;
  cl->scheduler.cluster_token = token;
  cl->node.cluster_token = token;
  const comm::TlsFiles tls_files{FLAGS_tls_cert, FLAGS_tls_key, FLAGS_tls_ca};
  if (tls_files.enabled()) {
    Result<std::shared_ptr<comm::TlsContext>> tls = comm::TlsContext::Load(tls_files);
    if (!tls.ok()) Die(prog, tls.status().message());
    cl->scheduler.tls = *tls;
    cl->node.tls = *tls;
  }
}

void FillSchedulerLink(CommandLine* cl) {
  cl->node.scheduler_host = FLAGS_scheduler_host;
  cl->node.scheduler_port = FLAGS_scheduler_port;
  cl->node.max_message_bytes = FLAGS_max_message_bytes;
  cl->scheduler.max_message_bytes = FLAGS_max_message_bytes;
}

}  // namespace pscore::node::flags

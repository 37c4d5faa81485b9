// braidrun — launches N local ranks of a program (DESIGN.md §7).
//
//   braidrun -n N [options] -- prog args...
//
// braidrun hosts the bootstrap TcpStoreServer for the lifetime of the job, forks N
// ranks with braid's (and torchrun's) launch variables in their environment, relays
// their output (optionally prefixed with "[rank R] "), and tears the whole job down
// when one rank fails, when the --timeout passes, or when braidrun is signalled.
// See docs/braidrun.md.
//
// House rule: braidrun never queries single environment variables; it copies
// `environ` and extends the copy for each rank.

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <braid/error.hpp>
#include <braid/store.hpp>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;
constexpr int kExitExec = 127;
constexpr std::chrono::milliseconds kGrace{2000};
constexpr std::size_t kMaxLine = 64 * 1024;  // a longer line without '\n' is emitted in pieces

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------
// Small utilities

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGCHLD:
      return "SIGCHLD";
    case SIGCONT:
      return "SIGCONT";
    case SIGSTOP:
      return "SIGSTOP";
    case SIGTSTP:
      return "SIGTSTP";
    case SIGTTIN:
      return "SIGTTIN";
    case SIGTTOU:
      return "SIGTTOU";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal " + std::to_string(sig);
  }
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s;
}

// braidrun's own diagnostics: one write(2) per message so they do not interleave.
void say(const std::string& msg) {
  std::string line = "braidrun: " + msg + "\n";
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    ssize_t w = ::write(STDERR_FILENO, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    left -= static_cast<std::size_t>(w);
  }
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

bool set_flags(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  int fdfl = ::fcntl(fd, F_GETFD);
  return fl >= 0 && fdfl >= 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 &&
         ::fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) == 0;
}

// Writes all of `data` to `fd`; waits for POLLOUT if fd happens to be non-blocking.
// Returns false when the fd is unusable (EPIPE, closed, ...).
bool write_all(int fd, const char* data, std::size_t len) {
  while (len > 0) {
    ssize_t w = ::write(fd, data, len);
    if (w > 0) {
      data += w;
      len -= static_cast<std::size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------
// Signals: a self-pipe turns SIGCHLD and the forwarded signals into poll events.

int g_sig_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_sig_pipe[1], &b, 1);  // pipe full: a wake-up is already pending
  errno = saved;
}

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

// ---------------------------------------------------------------------------------
// Options

struct Options {
  int nproc = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string host_ids_csv;
  int hosts = 0;
  bool prefix = false;
  double timeout_s = 0;
  std::vector<std::string> env;
  std::string bind_to = "auto";
  bool keep_going = false;
  std::vector<std::string> command;
  std::vector<std::string> host_ids;  // one per rank, empty when no host ids were given
};

const char* const kLaunchVars[] = {"BRAID_RANK",           "BRAID_WORLD_SIZE",  "BRAID_LOCAL_RANK",
                                   "BRAID_LOCAL_SIZE",     "BRAID_MASTER_ADDR", "BRAID_MASTER_PORT",
                                   "BRAID_STORE_EXTERNAL", "BRAID_HOST_ID",     "RANK",
                                   "WORLD_SIZE",           "LOCAL_RANK",        "LOCAL_WORLD_SIZE",
                                   "MASTER_ADDR",          "MASTER_PORT"};

bool is_launch_var(const std::string& key) {
  for (const char* v : kLaunchVars)
    if (key == v) return true;
  return false;
}

// Parses and validates the command line. Returns an exit code when braidrun should
// stop now (0 after --help, kExitUsage on errors), nothing to go on.
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "braidrun: launch N local ranks of a braid (or torch) program.\n"
      "Usage: braidrun -n N [options] -- prog args...",
      "braidrun"};
  app.add_option("-n,--nproc", o.nproc, "Number of ranks to start (>= 1)")->required();
  app.add_option("--master-addr", o.master_addr,
                 "Address the bootstrap store binds to and ranks connect to (default 127.0.0.1)");
  app.add_option("--master-port", o.master_port, "Port of the bootstrap store (default 0: any free port)")
      ->check(CLI::Range(0, 65535));
  auto* ids = app.add_option("--host-id-per-rank", o.host_ids_csv,
                             "Comma-separated host ids, one per rank (e.g. h0,h0,h1,h1); "
                             "sets BRAID_HOST_ID to emulate several hosts");
  app.add_option("--hosts", o.hosts, "Emulate K hosts h0..h{K-1}, ranks assigned in contiguous blocks")
      ->excludes(ids);
  app.add_flag("-p,--prefix", o.prefix, "Prefix each output line with \"[rank R] \"");
  app.add_flag("--keep-going", o.keep_going,
               "A rank that fails does not stop the others: for jobs whose survivors shrink their "
               "communicator and go on (the store stays up); the exit status is still the first failure's");
  app.add_option("--timeout", o.timeout_s,
                 "Deadline for the whole job in seconds (0: none); on expiry exit 124");
  app.add_option("--env", o.env, "KEY=VALUE added to every rank's environment (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--bind-to", o.bind_to,
                 "cores: each rank runs on its own share of the cores braidrun may use (rank r on the "
                 "r-th slice, as mpirun --bind-to core); none: the scheduler places them; auto (default): "
                 "cores when there are no more ranks than cores, else none")
      ->check(CLI::IsMember({"auto", "cores", "none"}));
  // Everything from the first positional argument (or after "--") is the program.
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    say("unknown option '" + rest.front() + "' (put the program after '--'; see braidrun --help)");
    return kExitUsage;
  }
  o.command = std::move(rest);

  if (o.nproc < 1) {
    say("-n must be at least 1 (got " + std::to_string(o.nproc) + ")");
    return kExitUsage;
  }
  if (o.command.empty() || o.command.front().empty()) {
    say("no program given; usage: braidrun -n N [options] -- prog args...");
    return kExitUsage;
  }
  if (!(o.timeout_s >= 0) || !std::isfinite(o.timeout_s)) {
    say("--timeout must be a number of seconds >= 0");
    return kExitUsage;
  }
  for (const std::string& kv : o.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      say("--env expects KEY=VALUE, got '" + kv + "'");
      return kExitUsage;
    }
    if (is_launch_var(kv.substr(0, eq))) {
      say("--env cannot set " + kv.substr(0, eq) + ": braidrun sets it for each rank");
      return kExitUsage;
    }
  }
  if (!o.host_ids_csv.empty() || app.count("--host-id-per-rank") > 0) {
    std::size_t start = 0;
    for (;;) {
      std::size_t comma = o.host_ids_csv.find(',', start);
      o.host_ids.push_back(o.host_ids_csv.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (o.host_ids.size() != static_cast<std::size_t>(o.nproc)) {
      say("--host-id-per-rank lists " + std::to_string(o.host_ids.size()) + " host id(s) but -n is " +
          std::to_string(o.nproc) + "; give exactly one per rank");
      return kExitUsage;
    }
    for (std::size_t r = 0; r < o.host_ids.size(); ++r) {
      if (o.host_ids[r].empty()) {
        say("--host-id-per-rank: empty host id for rank " + std::to_string(r));
        return kExitUsage;
      }
    }
  } else if (app.count("--hosts") > 0) {
    if (o.hosts < 1 || o.hosts > o.nproc) {
      say("--hosts must be between 1 and -n (" + std::to_string(o.nproc) + "), got " +
          std::to_string(o.hosts));
      return kExitUsage;
    }
    for (int r = 0; r < o.nproc; ++r)
      o.host_ids.push_back("h" + std::to_string(static_cast<long long>(r) * o.hosts / o.nproc));
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------
// Ranks and their output

struct Stream {
  int fd = -1;      // read end of the rank's pipe; -1 when closed or not piped
  int out_fd = -1;  // where its lines go (1 or 2)
  std::string buf;  // bytes of an incomplete line
};

struct Rank {
  int rank = 0;
  bool bound = false;  // run on `cpus` (--bind-to)
  cpu_set_t cpus;
  pid_t pid = -1;
  bool running = false;
  std::string prefix;
  Stream out, err;
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
};

class Launcher {
 public:
  explicit Launcher(Options o) : o_(std::move(o)) {}
  int run();

 private:
  void build_environments(const std::string& addr, std::uint16_t port);
  /// --bind-to: gives each rank its slice of the cores braidrun may run on. False after
  /// saying why when `cores` was asked for more ranks than there are cores.
  bool bind_ranks();
  // Starts rank `r`. Returns 0, or the exit code for braidrun when it could not
  // (kExitExec when the program cannot be executed; the message is printed).
  int spawn(Rank& r);
  void loop();
  void read_stream(Rank& r, Stream& s, bool drain);
  void emit(Rank& r, Stream& s, const char* data, std::size_t len);
  void flush_partial(Rank& r, Stream& s);
  void reap();
  void on_exit(Rank& r, int status);
  void on_forwarded_signal(int sig);
  void begin_termination();
  void signal_running(int sig);
  std::vector<int> running_ranks() const;
  int live() const;

  Options o_;
  std::vector<Rank> ranks_;
  std::vector<std::string> argv_storage_;
  std::vector<char*> argv_;
  bool terminating_ = false;
  bool timed_out_ = false;
  int first_failure_code_ = 0;
  bool have_failure_ = false;
  int received_signal_ = 0;
  bool stdout_ok_ = true, stderr_ok_ = true;
  std::optional<Clock::time_point> job_deadline_, kill_deadline_;
  bool hup_ignored_ = false;
  std::string token_;             // the job's BRAID_AUTH_TOKEN
  bool generated_token_ = false;  // made here (then every rank gets it)
};

void Launcher::build_environments(const std::string& addr, std::uint16_t port) {
  const int n = o_.nproc;
  // Local rank and size per host id (everything on one host when none were given).
  std::vector<int> local_rank(n), local_size(n);
  for (int r = 0; r < n; ++r) {
    const std::string h = o_.host_ids.empty() ? std::string() : o_.host_ids[r];
    int before = 0, total = 0;
    for (int q = 0; q < n; ++q) {
      const std::string hq = o_.host_ids.empty() ? std::string() : o_.host_ids[q];
      if (hq != h) continue;
      ++total;
      if (q < r) ++before;
    }
    local_rank[r] = before;
    local_size[r] = total;
  }

  // The inherited environment minus every key braidrun or --env sets.
  std::set<std::string> overridden(std::begin(kLaunchVars), std::end(kLaunchVars));
  if (generated_token_) overridden.insert("BRAID_AUTH_TOKEN");
  for (const std::string& kv : o_.env) overridden.insert(kv.substr(0, kv.find('=')));
  const bool keep_host_id = o_.host_ids.empty();  // an inherited BRAID_HOST_ID stays then
  std::vector<std::string> base;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    if (overridden.count(key) && !(keep_host_id && key == "BRAID_HOST_ID")) continue;
    base.push_back(std::move(kv));
  }
  for (const std::string& kv : o_.env) base.push_back(kv);

  ranks_.resize(n);
  for (int r = 0; r < n; ++r) {
    Rank& rk = ranks_[r];
    rk.rank = r;
    rk.prefix = "[rank " + std::to_string(r) + "] ";
    rk.env_storage = base;
    auto add = [&](const char* k, const std::string& v) {
      rk.env_storage.push_back(std::string(k) + "=" + v);
    };
    add("BRAID_RANK", std::to_string(r));
    add("BRAID_WORLD_SIZE", std::to_string(n));
    add("BRAID_LOCAL_RANK", std::to_string(local_rank[r]));
    add("BRAID_LOCAL_SIZE", std::to_string(local_size[r]));
    add("BRAID_MASTER_ADDR", addr);
    add("BRAID_MASTER_PORT", std::to_string(port));
    add("BRAID_STORE_EXTERNAL", "1");
    if (generated_token_) add("BRAID_AUTH_TOKEN", token_);
    if (!o_.host_ids.empty()) add("BRAID_HOST_ID", o_.host_ids[r]);
    add("RANK", std::to_string(r));
    add("WORLD_SIZE", std::to_string(n));
    add("LOCAL_RANK", std::to_string(local_rank[r]));
    add("LOCAL_WORLD_SIZE", std::to_string(local_size[r]));
    add("MASTER_ADDR", addr);
    add("MASTER_PORT", std::to_string(port));
    for (std::string& s : rk.env_storage) rk.envp.push_back(s.data());
    rk.envp.push_back(nullptr);
  }
}

bool Launcher::bind_ranks() {
  if (o_.bind_to == "none") return true;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (::sched_getaffinity(0, sizeof mine, &mine) != 0) {
    say(std::string("--bind-to: cannot read braidrun's cores (") + std::strerror(errno) + "); ranks are not bound");
    return o_.bind_to == "auto";
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  const int n = o_.nproc, k = static_cast<int>(cpus.size());
  if (n > k) {
    // More ranks than cores: binding would only fix which ranks share a core; the
    // scheduler moves them to whichever core is free.
    if (o_.bind_to == "auto") return true;
    say("--bind-to cores: " + std::to_string(n) + " ranks but braidrun may use only " + std::to_string(k) +
        " core(s); use --bind-to none to run them anyway");
    return false;
  }
  // Rank r gets the r-th of n nearly equal slices, in the order the kernel numbers the
  // cores (the first k % n ranks one core more), so that a rank's threads stay together
  // and no two ranks wait for one core while another idles: with two ranks on two cores
  // under load, an unbound pair sharing a core took 50 us per 4 KiB all-reduce.
  int next = 0;
  for (int r = 0; r < n; ++r) {
    const int take = k / n + (r < k % n ? 1 : 0);
    Rank& rk = ranks_[static_cast<std::size_t>(r)];
    CPU_ZERO(&rk.cpus);
    for (int i = 0; i < take; ++i) CPU_SET(cpus[static_cast<std::size_t>(next++)], &rk.cpus);
    rk.bound = true;
  }
  return true;
}

// Moves `fd` onto `target` in a child (between fork and exec: async-signal-safe only).
void child_move_fd(int fd, int target) {
  if (fd == target) {
    int fl = ::fcntl(fd, F_GETFD);
    if (fl >= 0) ::fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC);
  } else {
    ::dup2(fd, target);
  }
}

void child_write(const char* s) {  // async-signal-safe
  std::size_t len = std::strlen(s);
  while (len > 0) {
    ssize_t w = ::write(STDERR_FILENO, s, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    len -= static_cast<std::size_t>(w);
  }
}

int Launcher::spawn(Rank& r) {
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (o_.prefix) {
    if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
      say("cannot create output pipes for rank " + std::to_string(r.rank) + ": " + std::strerror(errno));
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
        if (fd >= 0) ::close(fd);
      return 1;
    }
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      int fl = ::fcntl(fd, F_GETFD);
      ::fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    }
  }
  // Rank 0 may read braidrun's stdin unless it is a terminal (ranks sit in their own
  // process groups, so reading the terminal would stop them); the others get /dev/null.
  const bool null_stdin = r.rank != 0 || ::isatty(STDIN_FILENO);
  // Close-on-exec pipe: EOF means exec succeeded, an int on it is exec's errno.
  int exec_pipe[2] = {-1, -1};
  if (::pipe(exec_pipe) != 0) {
    say(std::string("cannot create a pipe: ") + std::strerror(errno));
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
      if (fd >= 0) ::close(fd);
    return 1;
  }
  for (int fd : exec_pipe) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  const pid_t parent = ::getpid();

  // No handler may run in the child before exec: block everything around fork.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
    if (!hup_ignored_) ::sigaction(SIGHUP, &dfl, nullptr);
    ::setpgid(0, 0);
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive braidrun, even after SIGKILL
    if (::getppid() != parent) ::_exit(kExitExec);
#else
    (void)parent;
#endif
    if (o_.prefix) {
      child_move_fd(out_pipe[1], STDOUT_FILENO);
      child_move_fd(err_pipe[1], STDERR_FILENO);
    }
    if (null_stdin) {
      int dn = ::open("/dev/null", O_RDONLY);
      if (dn >= 0 && dn != STDIN_FILENO) {
        ::dup2(dn, STDIN_FILENO);
        ::close(dn);
      }
    }
    if (r.bound) ::sched_setaffinity(0, sizeof r.cpus, &r.cpus);  // threads made later inherit it
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::execvpe(argv_[0], argv_.data(), r.envp.data());
    int e = errno;
    if (::write(exec_pipe[1], &e, sizeof e) != static_cast<ssize_t>(sizeof e)) {
      child_write("braidrun: cannot execute '");  // the parent will not say it
      child_write(argv_[0]);
      child_write("': ");
      child_write(std::strerror(e));
      child_write("\n");
    }
    ::_exit(kExitExec);
  }
  int fork_errno = errno;
  if (pid > 0) ::setpgid(pid, pid);  // also here, so the group exists before we signal it
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);

  ::close(exec_pipe[1]);
  if (o_.prefix) {
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
  }
  auto close_read_ends = [&] {
    ::close(exec_pipe[0]);
    if (o_.prefix) {
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
    }
  };
  if (pid < 0) {
    say("cannot fork rank " + std::to_string(r.rank) + ": " + std::strerror(fork_errno));
    close_read_ends();
    return 1;
  }
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    say("cannot execute '" + o_.command.front() + "': " + std::strerror(exec_errno));
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close_read_ends();
    return kExitExec;
  }
  ::close(exec_pipe[0]);
  r.pid = pid;
  r.running = true;
  if (o_.prefix) {
    set_flags(out_pipe[0]);
    set_flags(err_pipe[0]);
    r.out = Stream{out_pipe[0], STDOUT_FILENO, {}};
    r.err = Stream{err_pipe[0], STDERR_FILENO, {}};
  }
  return 0;
}

int Launcher::live() const {
  int n = 0;
  for (const Rank& r : ranks_) n += r.running ? 1 : 0;
  return n;
}

std::vector<int> Launcher::running_ranks() const {
  std::vector<int> v;
  for (const Rank& r : ranks_)
    if (r.running) v.push_back(r.rank);
  return v;
}

void Launcher::signal_running(int sig) {
  for (const Rank& r : ranks_)
    if (r.running && ::killpg(r.pid, sig) != 0) ::kill(r.pid, sig);
}

void Launcher::begin_termination() {
  if (terminating_) return;
  terminating_ = true;
  signal_running(SIGTERM);
  kill_deadline_ = Clock::now() + kGrace;
}

void Launcher::emit(Rank& r, Stream& s, const char* data, std::size_t len) {
  bool& ok = s.out_fd == STDOUT_FILENO ? stdout_ok_ : stderr_ok_;
  if (!ok) return;
  std::string line;
  line.reserve(r.prefix.size() + len + 1);
  line.append(r.prefix).append(data, len).push_back('\n');
  ok = write_all(s.out_fd, line.data(), line.size());
}

void Launcher::flush_partial(Rank& r, Stream& s) {
  if (!s.buf.empty()) emit(r, s, s.buf.data(), s.buf.size());
  s.buf.clear();
}

// Reads what `s` has now, emitting complete lines: a few chunks at most, so that one
// chatty rank cannot starve the others, or everything buffered when `drain` is set.
void Launcher::read_stream(Rank& r, Stream& s, bool drain) {
  char chunk[65536];
  for (int rounds = 0; s.fd >= 0 && (drain || rounds < 4); ++rounds) {
    ssize_t got = ::read(s.fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) {  // EOF or error
      ::close(s.fd);
      s.fd = -1;
      flush_partial(r, s);
      return;
    }
    s.buf.append(chunk, static_cast<std::size_t>(got));
    std::size_t start = 0;
    for (;;) {
      std::size_t nl = s.buf.find('\n', start);
      if (nl == std::string::npos) break;
      emit(r, s, s.buf.data() + start, nl - start);
      start = nl + 1;
    }
    s.buf.erase(0, start);
    while (s.buf.size() >= kMaxLine) {
      emit(r, s, s.buf.data(), kMaxLine);
      s.buf.erase(0, kMaxLine);
    }
  }
}

void Launcher::on_exit(Rank& r, int status) {
  r.running = false;
  // Print the rank's last words before braidrun's verdict on it.
  if (r.out.fd >= 0) read_stream(r, r.out, true);
  if (r.err.fd >= 0) read_stream(r, r.err, true);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (ok || terminating_) return;
  int code;
  if (WIFSIGNALED(status)) {
    code = 128 + WTERMSIG(status);
    say("rank " + std::to_string(r.rank) + " killed by signal " + signal_name(WTERMSIG(status)));
  } else {
    code = WEXITSTATUS(status);
    say("rank " + std::to_string(r.rank) + " exited with status " + std::to_string(code));
  }
  if (!have_failure_) first_failure_code_ = code;
  have_failure_ = true;
  if (o_.keep_going) {
    if (live() > 0) say("--keep-going: ranks " + join(running_ranks()) + " go on");
    return;
  }
  if (live() > 0) {
    say("terminating the other ranks (" + join(running_ranks()) + ")");
    begin_termination();
  }
}

void Launcher::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    for (Rank& r : ranks_) {
      if (r.pid == pid && r.running) {
        on_exit(r, status);
        break;
      }
    }
  }
}

void Launcher::on_forwarded_signal(int sig) {
  if (received_signal_ != 0) {
    say("received " + signal_name(sig) + " while stopping; sending SIGKILL to ranks " +
        join(running_ranks()));
    signal_running(SIGKILL);
    kill_deadline_.reset();
    terminating_ = true;
    return;
  }
  received_signal_ = sig;
  say("received " + signal_name(sig) + "; forwarding it to ranks " + join(running_ranks()));
  terminating_ = true;
  signal_running(sig);
  kill_deadline_ = Clock::now() + kGrace;
}

void Launcher::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> owners;
  while (live() > 0) {
    fds.clear();
    owners.clear();
    fds.push_back({g_sig_pipe[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
    }
    int wait_ms = -1;
    const auto now = Clock::now();
    for (const auto& d : {job_deadline_, kill_deadline_}) {
      if (!d) continue;
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(*d - now).count();
      ms = std::max<decltype(ms)>(ms, 0);
      if (wait_ms < 0 || ms < wait_ms) wait_ms = static_cast<int>(std::min<decltype(ms)>(ms, 1 << 30));
    }
    int rc = ::poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) {
      say(std::string("poll failed: ") + std::strerror(errno));
      signal_running(SIGKILL);
      kill_deadline_.reset();
    }
    if (rc > 0) {
      for (std::size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) read_stream(*owners[i].first, *owners[i].second, false);
      if (fds[0].revents) {
        unsigned char sigs[64];
        ssize_t got;
        while ((got = ::read(g_sig_pipe[0], sigs, sizeof sigs)) > 0) {
          for (ssize_t i = 0; i < got; ++i)
            if (sigs[i] != SIGCHLD) on_forwarded_signal(sigs[i]);
        }
      }
    }
    reap();  // cheap; also covers a SIGCHLD whose byte did not fit in the pipe
    if (live() == 0) break;

    const auto t = Clock::now();
    if (job_deadline_ && t >= *job_deadline_) {
      job_deadline_.reset();
      // Already tearing down (a rank failed, or a signal came): that cause stands and
      // the grace period bounds what is left.
      if (!terminating_) {
        timed_out_ = true;
        say("timeout: the job is still running after " + seconds_text(o_.timeout_s) +
            " s; ranks still running: " + join(running_ranks()) + "; sending SIGTERM");
        begin_termination();
      }
    }
    if (kill_deadline_ && t >= *kill_deadline_) {
      kill_deadline_.reset();
      say("ranks " + join(running_ranks()) + " still running " + std::to_string(kGrace.count() / 1000) +
          " s after being signalled; sending SIGKILL");
      signal_running(SIGKILL);
    }
  }
  // Every rank is gone: whatever they wrote is in the pipes. Anything a leftover
  // grandchild writes later is dropped.
  for (Rank& r : ranks_) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd < 0) continue;
      read_stream(r, *s, true);
      if (s->fd >= 0) {
        ::close(s->fd);
        s->fd = -1;
      }
      flush_partial(r, *s);
    }
  }
}

int Launcher::run() {
  argv_storage_ = o_.command;
  for (std::string& a : argv_storage_) argv_.push_back(a.data());
  argv_.push_back(nullptr);

  // Signals first, so that no thread (the store's included) can be killed by them.
  if (::pipe(g_sig_pipe) != 0 || !set_flags(g_sig_pipe[0]) || !set_flags(g_sig_pipe[1])) {
    say(std::string("cannot create a pipe: ") + std::strerror(errno));
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  struct sigaction chld = sa;
  chld.sa_flags |= SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &chld, nullptr);
  for (int sig : kForwarded) {
    struct sigaction prev {};
    ::sigaction(sig, nullptr, &prev);
    if (sig == SIGHUP && prev.sa_handler == SIG_IGN) {  // nohup braidrun ...: keep ignoring
      hup_ignored_ = true;
      continue;
    }
    ::sigaction(sig, &sa, nullptr);
  }
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, nullptr);

  // The job's token: --env BRAID_AUTH_TOKEN=... when given, else a fresh random one that
  // every rank gets in its environment (replacing an inherited one). The store serves
  // only clients that present it, and the ranks' connections carry it, without it ever
  // being written to the store (docs/reliability.md, "Threat model").
  for (const std::string& kv : o_.env)
    if (kv.rfind("BRAID_AUTH_TOKEN=", 0) == 0) token_ = kv.substr(sizeof("BRAID_AUTH_TOKEN=") - 1);
  if (token_.empty()) {
    std::random_device rd;
    char buf[40];
    std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    token_ = buf;
    generated_token_ = true;
  }
  std::unique_ptr<braid::TcpStoreServer> server;
  try {
    server = std::make_unique<braid::TcpStoreServer>(o_.master_addr, static_cast<std::uint16_t>(o_.master_port),
                                                     token_);
  } catch (const std::exception& e) {
    say("cannot start the bootstrap store on " + o_.master_addr + ": " + e.what());
    return 1;
  }
  // A wildcard bind is not an address to connect to; local ranks use loopback.
  std::string advertise = o_.master_addr;
  if (advertise == "0.0.0.0" || advertise == "::" || advertise == "[::]") advertise = "127.0.0.1";
  build_environments(advertise, server->port());
  if (!bind_ranks()) return kExitUsage;

  if (o_.timeout_s > 0)
    job_deadline_ = Clock::now() +
                    std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeout_s));
  for (Rank& r : ranks_) {
    if (int rc = spawn(r); rc != 0) {
      have_failure_ = true;
      first_failure_code_ = rc;
      if (live() > 0) {
        say("terminating the ranks already started (" + join(running_ranks()) + ")");
        begin_termination();
      }
      break;
    }
  }
  loop();
  server.reset();

  if (timed_out_) return kExitTimeout;
  if (have_failure_) return first_failure_code_;
  if (received_signal_) return 128 + received_signal_;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (auto rc = parse_options(argc, argv, o)) return *rc;
  try {
    Launcher launcher(std::move(o));
    return launcher.run();
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
    return 1;
  }
}

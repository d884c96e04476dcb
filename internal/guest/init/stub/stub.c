/*
 * corral-initstub: PID 1 of an idle container sandbox (see package initproc,
 * stub.go). corral-init's setup stage builds and hardens the sandbox, then
 * execs this program in its place, so it runs with init's namespaces,
 * capabilities, seccomp filter and Landlock domain. It is one thread and a
 * few pages: it reaps every process, answers the node's ping and kill
 * requests itself, and hands every other connection to corral-init's Go
 * server ("corral-init serve child"), started on demand, which exits after
 * a linger with nothing to serve.
 *
 * Sandbox root can kill a server (it is not PID 1): its commands are then
 * the stub's orphans. The server tells the stub each command it started,
 * with a copy of its connection, so that the stub reports the exit of a
 * command whose server is gone, and relays the node's kills on it. So that
 * no command runs (and kills) before the stub knows it, the server starts
 * each through this program as a gate (argv[0] GATE_NAME): it waits for the
 * server's go-ahead, then execs the command (see gate).
 *
 * It never decodes the Go protocol: argv carries, encoded by the setup
 * stage, the exact packets to match and to send:
 *   1 ready reply   2 ping request   3 pong reply
 *   4..6 a kill request cut around its pgid and signal
 *   7 the kill reply   8 the error reply when no server can start
 *   9,10 an exit reply cut around its code   11,12 the same of a signal
 *   13,14 a kill request on an exec's connection cut around its signal
 *   15,16 the fds of corral-init and of this program
 *
 * Fds at start: 0-2 stdio (2 is init.log), 3 the control listener, 4 the
 * setup socket, and those argv 15 and 16 name: corral-init (O_PATH) and
 * this program (the server's fd 4). Every fd it makes is close-on-exec.
 *
 * A connection handed over to a server is lost if the server dies before
 * it receives it (a kill -9 -1 takes a moment to end a Go process), so the
 * stub keeps its copy until the server acknowledges it (MSG_TOOK) and hands
 * what a dead server never took to the next one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { LISTEN_FD = 3, SETUP_FD = 4, SERVER_FD = 3, SERVER_GATE_FD = 4 };

/* init_fd is corral-init, stub_fd this program (argv). */
static int init_fd, stub_fd;

/* A gate's fds: the go-ahead pipe, the exec error pipe, this program. */
enum { GATE_GO_FD = 3, GATE_ERR_FD = 4, GATE_BIN_FD = 5 };
#define GATE_NAME "corral-gate"

/* MAX_CONNS bounds connections waiting for their first packet, MAX_HELD
 * those a server has not acknowledged. */
enum { MAX_CONNS = 256, MAX_HELD = 256 };

/* A server's one-byte messages: it runs (and its threads are made); it
 * received the oldest connection it had not acknowledged (stub.go). */
enum { MSG_READY = 1, MSG_TOOK = 2 };

enum {
	A_READY = 1, A_PING, A_PONG, A_KILL0, A_KILL1, A_KILL2, A_KILLOK, A_NOSERVER,
	A_EXIT0, A_EXIT1, A_SIG0, A_SIG1, A_EKILL0, A_EKILL1, A_INITFD, A_SELFFD, A_COUNT
};

static char **pkt;
static size_t pktlen[A_COUNT];

/* conns wait for their first packet. */
static int conns[MAX_CONNS];
static int nconns;

/* execs are the commands servers started, with a copy of each connection. */
static struct {
	pid_t pid;
	int fd;
} execs[MAX_CONNS];
static int nexecs;

/* A connection handed over but not acknowledged, and whether a server
 * that died had it before. */
struct held {
	int fd;
	int again;
};

/*
 * The current server: its pid (0: none), the stub's end of its socketpair,
 * whether it said it is ready, and the connections it has not yet
 * acknowledged, oldest first.
 */
static struct {
	pid_t pid;
	int sock;
	int ready;
	struct held held[MAX_HELD];
	int nheld;
} srv;

static void logf_(const char *what)
{
	dprintf(2, "corral-initstub: %s: %s\n", what, strerror(errno));
}

static void reply(int fd, int which)
{
	(void)send(fd, pkt[which], pktlen[which], MSG_NOSIGNAL | MSG_DONTWAIT);
}

static int server_msg(void);
static void hand_over(int fd, int again);

/* peer_gone says whether the process at the other end of sock closed it. */
static int peer_gone(int sock)
{
	struct pollfd p = {.fd = sock, .events = POLLRDHUP};
	return poll(&p, 1, 0) > 0 && (p.revents & POLLHUP);
}

/*
 * drop_server forgets the server: it exited, or it refused a hand-over.
 * What it said before that is read first. A refusing server that lives is
 * retiring and serves what it took. A dead one never received what it had
 * not acknowledged: that goes to a new server, once, unless this one died
 * starting (the sandbox is then at a limit) and it gets the error reply.
 */
static void drop_server(void)
{
	while (server_msg() > 0) {
	}
	int gone = peer_gone(srv.sock), ready = srv.ready, n = srv.nheld;
	struct held left[MAX_HELD];
	memcpy(left, srv.held, n * sizeof *left);
	close(srv.sock);
	srv.pid = 0;
	srv.sock = -1;
	srv.ready = 0;
	srv.nheld = 0;
	for (int i = 0; i < n; i++) {
		if (!gone) {
			close(left[i].fd);
		} else if (ready && !left[i].again) {
			hand_over(left[i].fd, 1);
		} else {
			reply(left[i].fd, A_NOSERVER);
			close(left[i].fd);
		}
	}
}

static int start_server(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		logf_("socketpair");
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		logf_("fork server");
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	if (pid == 0) {
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		if (dup2(sv[1], SERVER_FD) < 0 || dup2(stub_fd, SERVER_GATE_FD) < 0)
			_exit(127);
		char *argv[] = {"corral-init", "serve", "child", NULL};
		char *envp[] = {"GOMAXPROCS=1", NULL};
		syscall(SYS_execveat, init_fd, "", argv, envp, AT_EMPTY_PATH);
		logf_("exec server");
		_exit(127);
	}
	close(sv[1]);
	srv.pid = pid;
	srv.sock = sv[0];
	srv.ready = 0;
	srv.nheld = 0;
	return 0;
}

static int send_fd(int sock, int fd)
{
	char byte = 0;
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof u);
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 ? -1 : 0;
}

/*
 * hand_over gives fd, its first packet unread, to the server, starting one
 * if none runs; again says a server that died had it before. A server that
 * shut its socket is retiring (it serves what it took, then exits): a new
 * one takes over.
 */
static void hand_over(int fd, int again)
{
	for (int try = 0; try < 2; try++) {
		if (srv.pid == 0 && start_server() < 0)
			break;
		if (srv.nheld == MAX_HELD)
			break; /* a server that far behind is stuck */
		if (send_fd(srv.sock, fd) == 0) {
			srv.held[srv.nheld++] = (struct held){.fd = fd, .again = again};
			return;
		}
		if (errno != EPIPE && errno != ECONNRESET) {
			logf_("hand over");
			break;
		}
		drop_server();
	}
	reply(fd, A_NOSERVER);
	close(fd);
}

/* parse_num reads a decimal int at *p (at most 9 digits) up to end. */
static int parse_num(const char **p, const char *end, long *out)
{
	long v = 0;
	int n = 0;
	while (*p < end && **p >= '0' && **p <= '9' && n < 9) {
		v = v * 10 + (**p - '0');
		(*p)++;
		n++;
	}
	*out = v;
	return n > 0;
}

static int match(const char **p, const char *end, int which)
{
	size_t n = pktlen[which];
	if ((size_t)(end - *p) < n || memcmp(*p, pkt[which], n) != 0)
		return 0;
	*p += n;
	return 1;
}

/* kill_of matches a kill request, returning its pgid and signal. */
static int kill_of(const char *b, size_t n, long *pgid, long *sig)
{
	const char *p = b, *end = b + n;
	return match(&p, end, A_KILL0) && parse_num(&p, end, pgid) && match(&p, end, A_KILL1) &&
	       parse_num(&p, end, sig) && match(&p, end, A_KILL2) && p == end;
}

/*
 * recv_now is a non-blocking recv whose end of file is confirmed by a
 * second look: the kernel checks a SOCK_SEQPACKET queue before the peer's
 * shutdown, so a packet sent just before the peer closed can read as end
 * of file (initproto's peekLen).
 */
static ssize_t recv_now(int fd, char *b, size_t len, int flags)
{
	ssize_t n = recv(fd, b, len, flags | MSG_DONTWAIT);
	if (n == 0)
		n = recv(fd, b, len, flags | MSG_DONTWAIT);
	return n;
}

/*
 * serve_conn looks at a connection's first packet: a ping or a kill it
 * answers (and closes, as the server does); anything else, and a kill the
 * kernel refused (the server then reports why), goes to the server. It
 * returns 1 when the connection is no longer the stub's to poll.
 */
static int serve_conn(int fd)
{
	char b[512];
	ssize_t n = recv_now(fd, b, sizeof b, MSG_PEEK | MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n <= 0) {
		close(fd);
		return 1;
	}
	if ((size_t)n <= sizeof b) {
		long pgid, sig;
		int ok = 0;
		if ((size_t)n == pktlen[A_PING] && memcmp(b, pkt[A_PING], n) == 0) {
			ok = A_PONG;
		} else if (kill_of(b, n, &pgid, &sig) && pgid > 1 && sig > 0 && sig <= 64) {
			if (kill(-pgid, sig) == 0 || errno == ESRCH)
				ok = A_KILLOK;
		}
		if (ok) {
			(void)recv(fd, b, 1, MSG_DONTWAIT); /* consumes the packet */
			reply(fd, ok);
			close(fd);
			return 1;
		}
	}
	hand_over(fd, 0);
	return 1;
}

static void forget_exec(int i)
{
	close(execs[i].fd);
	execs[i] = execs[--nexecs];
}

/* report_exit sends the exit of an orphaned command its server never reported. */
static void report_exit(pid_t pid, int st)
{
	for (int i = 0; i < nexecs; i++) {
		if (execs[i].pid != pid)
			continue;
		char b[160];
		int n;
		if (WIFSIGNALED(st))
			n = snprintf(b, sizeof b, "%s%d%s", pkt[A_SIG0], WTERMSIG(st), pkt[A_SIG1]);
		else
			n = snprintf(b, sizeof b, "%s%d%s", pkt[A_EXIT0], WEXITSTATUS(st), pkt[A_EXIT1]);
		if (n > 0 && (size_t)n < sizeof b)
			(void)send(execs[i].fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		forget_exec(i);
		return;
	}
}

static void reap(void)
{
	int st;
	pid_t pid;
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0 || (pid < 0 && errno == EINTR)) {
		if (pid <= 0)
			continue;
		if (pid == srv.pid)
			drop_server();
		else
			report_exit(pid, st);
	}
}

/*
 * server_msg reads one thing the server says: a byte, MSG_READY or
 * MSG_TOOK; a pid with a connection for each command it started; a pid
 * alone once it reported that command's exit itself. It returns 0 when
 * there was nothing to read.
 */
static int server_msg(void)
{
	pid_t pid = 0;
	struct iovec iov = {.iov_base = &pid, .iov_len = sizeof pid};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	ssize_t n = recvmsg(srv.sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return 0; /* EOF: the server died; its exit drops it */
	int fd = -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
		memcpy(&fd, CMSG_DATA(c), sizeof fd);
	if (n == 1 && fd < 0) {
		unsigned char what = *(unsigned char *)&pid;
		if (what == MSG_READY) {
			srv.ready = 1;
		} else if (what == MSG_TOOK && srv.nheld > 0) {
			close(srv.held[0].fd);
			memmove(srv.held, srv.held + 1, --srv.nheld * sizeof *srv.held);
		}
		return 1;
	}
	if (n != sizeof pid) {
		if (fd >= 0)
			close(fd);
		return 1;
	}
	if (fd < 0) {
		for (int i = 0; i < nexecs; i++) {
			if (execs[i].pid == pid) {
				forget_exec(i);
				break;
			}
		}
		return 1;
	}
	if (nexecs == MAX_CONNS) {
		close(fd);
		return 1;
	}
	execs[nexecs].pid = pid;
	execs[nexecs++].fd = fd;
	return 1;
}

/*
 * exec_conn handles a tracked connection: the node closed it (the stub's
 * copy goes), or sent a kill, which the stub or the server may read: either
 * signals the command's group. It returns 1 when the entry went.
 */
static int exec_conn(int i)
{
	char b[128];
	ssize_t n = recv_now(execs[i].fd, b, sizeof b, MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n <= 0) {
		forget_exec(i);
		return 1;
	}
	const char *p = b, *end = b + ((size_t)n < sizeof b ? (size_t)n : sizeof b);
	long sig;
	if (match(&p, end, A_EKILL0) && parse_num(&p, end, &sig) && match(&p, end, A_EKILL1) && p == end &&
	    sig > 0 && sig <= 64)
		(void)kill(-execs[i].pid, sig);
	return 0;
}

static void accept_all(void)
{
	for (;;) {
		int fd = accept4(LISTEN_FD, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR)
				logf_("accept");
			return;
		}
		if (nconns == MAX_CONNS) {
			hand_over(fd, 0); /* the server waits for its packet */
			continue;
		}
		conns[nconns++] = fd;
	}
}

/*
 * The gate runs before libc starts: stub_entry, the program's entry point
 * (gcc -Wl,-e,stub_entry), calls gate_entry first, and jumps to libc's
 * _start only if this is not a gate. glibc's static start-up (probing the
 * CPU, resolving its ifuncs) took about 0.4 ms of every gated exec on a
 * 2-vCPU VM, more than the gate's own exec. So the gate calls no libc
 * function (most are ifuncs not resolved yet, errno is TLS not set up
 * yet) and has no stack protector (its canary is TLS too): raw system
 * calls only.
 */
#if defined(__x86_64__)
__asm__(".globl stub_entry\n"
	"stub_entry:\n"
	"	mov %rdx, %r12\n" /* _start's rtld_fini, kept across the call */
	"	mov (%rsp), %rdi\n"
	"	lea 8(%rsp), %rsi\n"
	"	call gate_entry\n"
	"	mov %r12, %rdx\n"
	"	jmp _start\n");

static long raw_syscall(long n, long a, long b, long c)
{
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return r;
}
#elif defined(__aarch64__)
__asm__(".globl stub_entry\n"
	"stub_entry:\n"
	"	mov x19, x0\n" /* _start's rtld_fini, kept across the call */
	"	ldr x0, [sp]\n"
	"	add x1, sp, #8\n"
	"	bl gate_entry\n"
	"	mov x0, x19\n"
	"	b _start\n");

static long raw_syscall(long n, long a, long b, long c)
{
	register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
	return x0;
}
#else
#error "corral-initstub: stub_entry is written for x86_64 and aarch64"
#endif

/* entered says main was reached through stub_entry (a build without the
 * -e flag would run no gate). */
static int entered;

/*
 * gate_entry returns unless argv[0] is GATE_NAME. A gate runs argv[1] with
 * argv[2...] and this environment once the server says go (it has told the
 * stub the pid); an exec error goes back to the server as an errno. No
 * go-ahead (the server died): the command never runs.
 */
__attribute__((used, no_stack_protector)) void gate_entry(long argc, char **argv)
{
	static const char name[] = GATE_NAME;
	entered = 1;
	if (argc < 1 || !argv[0])
		return;
	for (int i = 0; i < (int)sizeof name; i++) {
		if (argv[0][i] != name[i])
			return;
	}
	if (argc < 3)
		raw_syscall(__NR_exit_group, 127, 0, 0);
	char **envp = argv + argc + 1;
	char c;
	long n;
	raw_syscall(__NR_fcntl, GATE_ERR_FD, F_SETFD, FD_CLOEXEC);
	do
		n = raw_syscall(__NR_read, GATE_GO_FD, (long)&c, 1);
	while (n == -EINTR);
	if (n != 1)
		raw_syscall(__NR_exit_group, 127, 0, 0);
	raw_syscall(__NR_close, GATE_GO_FD, 0, 0);
	raw_syscall(__NR_close, GATE_BIN_FD, 0, 0);
	int e = (int)-raw_syscall(__NR_execve, (long)argv[1], (long)(argv + 2), (long)envp);
	raw_syscall(__NR_write, GATE_ERR_FD, (long)&e, sizeof e);
	raw_syscall(__NR_exit_group, 127, 0, 0);
}

int main(int argc, char **argv)
{
	if (!entered) {
		dprintf(2, "corral-initstub: built without -Wl,-e,stub_entry: it cannot gate commands\n");
		return 2;
	}
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (argc != A_COUNT) {
		dprintf(2, "corral-initstub: want %d arguments, got %d\n", A_COUNT - 1, argc - 1);
		return 2;
	}
	pkt = argv;
	for (int i = 1; i < A_COUNT; i++)
		pktlen[i] = strlen(argv[i]);
	srv.sock = -1;
	init_fd = atoi(argv[A_INITFD]);
	stub_fd = atoi(argv[A_SELFFD]);
	if (init_fd <= SETUP_FD || stub_fd <= SETUP_FD || fcntl(LISTEN_FD, F_SETFD, FD_CLOEXEC) < 0 ||
	    fcntl(init_fd, F_SETFD, FD_CLOEXEC) < 0 || fcntl(stub_fd, F_SETFD, FD_CLOEXEC) < 0 ||
	    fcntl(LISTEN_FD, F_SETFL, O_NONBLOCK) < 0) {
		logf_("inherited fds");
		return 2;
	}
	/* Signals keep their default action: the kernel does not deliver those
	 * to a namespace's init from inside it. SIGCHLD is read from an fd. */
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		logf_("signalfd");
		return 2;
	}
	if (send(SETUP_FD, pkt[A_READY], pktlen[A_READY], MSG_NOSIGNAL) < 0) {
		logf_("send ready");
		return 2;
	}
	close(SETUP_FD);

	static struct pollfd pf[3 + 2 * MAX_CONNS];
	for (;;) {
		int n = 0;
		pf[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = LISTEN_FD, .events = POLLIN};
		/* fd -1 is skipped by poll. */
		pf[n++] = (struct pollfd){.fd = srv.pid ? srv.sock : -1, .events = POLLIN};
		for (int i = 0; i < nconns; i++)
			pf[n++] = (struct pollfd){.fd = conns[i], .events = POLLIN};
		int polled_execs = nexecs;
		for (int i = 0; i < nexecs; i++)
			pf[n++] = (struct pollfd){.fd = execs[i].fd, .events = POLLIN};
		if (poll(pf, n, -1) < 0) {
			if (errno != EINTR)
				logf_("poll");
			continue;
		}
		/* Exec entries first, while pf still lines up with them. */
		for (int i = polled_execs - 1; i >= 0; i--) {
			if (pf[3 + nconns + i].revents && i < nexecs && execs[i].fd == pf[3 + nconns + i].fd)
				exec_conn(i);
		}
		if (pf[0].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0) {
			}
			reap();
		}
		if (pf[2].revents && srv.pid && srv.sock == pf[2].fd)
			server_msg();
		int keep = 0;
		for (int i = 0; i < nconns; i++) {
			if (pf[3 + i].revents && serve_conn(conns[i]))
				continue;
			conns[keep++] = conns[i];
		}
		nconns = keep;
		if (pf[1].revents)
			accept_all();
	}
}

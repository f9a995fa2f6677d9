import sys, collections
IDLE = ("Condition.wait", "wait_file", "socket.accept", "_worker (", "Thread.start", "Event.wait", "Runner.run")
CATS = [("digest (lindigest)", "lindigest"), ("TCP plane: receiving reads", "_Peer._receive"),
        ("TCP plane: serving peers' reads", "ReadServer"), ("hub exchanges (HTTP client, JSON)", "HubClient"),
        ("TCP plane: connecting to peers", "_Peer._connect"), ("fetch loop bookkeeping", "ChunkFetcher")]
c = collections.Counter(); total = busy = 0
for f in sys.argv[1:]:
    for line in open(f):
        line = line.rstrip()
        if not line: continue
        stack, n = line.rsplit(" ", 1); n = int(n); total += n
        leaf = stack.split(";")[-1]
        if not leaf or any(leaf.startswith(i) for i in IDLE): continue
        busy += n
        for name, key in CATS:
            if key in stack:
                c[name] += n; break
        else:
            c["other: " + leaf[:60]] += n
print("samples", total, "not waiting", busy)
for k, n in c.most_common(14): print(f"{n:5d} {100*n/busy:5.1f}% {k}")

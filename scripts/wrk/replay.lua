-- Replays request bodies prepared by scripts/bench.py (wrk 4.x, LuaJIT).
--
-- BENCH_BODIES names a file prefix: thread N (0-based) reads "<prefix>.<N>", one JSON body a
-- line, and posts them in order to the URL's path. BENCH_MODE=once sends each body once and
-- then leaves the connection idle (signed intents: a sequence is accepted once, and a
-- repeated body would be answered from the stored reply, a cheaper path that would skew the
-- figures); BENCH_MODE=cycle (the default) goes round the bodies for the whole run.
-- BENCH_HEADER="Name: value" adds one request header.
--
-- wrk's own req/s divides by the whole --duration, even when the bodies ran out earlier, so
-- done() prints its own count and span, on one line:
--   BENCH ok=<200 answers> other=<other statuses> sent=<requests> span=<seconds>
-- where span runs from the first request of any thread to the last answer of any thread.

local ffi = require("ffi")
ffi.cdef([[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]])
local CLOCK_MONOTONIC = 1
local ts = ffi.new("bench_timespec")

local function now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  local prefix = os.getenv("BENCH_BODIES")
  once = os.getenv("BENCH_MODE") == "once"
  local headers = { ["Content-Type"] = "application/json" }
  local extra = os.getenv("BENCH_HEADER")
  if extra ~= nil and extra ~= "" then
    local name, value = extra:match("^([^:]+):%s*(.*)$")
    headers[name] = value
  end
  reqs = {}
  for line in io.lines(prefix .. "." .. tid) do
    if #line > 0 then
      reqs[#reqs + 1] = wrk.format("POST", wrk.path, headers, line)
    end
  end
  nreqs = #reqs
  idx = 0
  ok = 0
  other = 0
  sent = 0
  t0 = 0
  t1 = 0
end

function request()
  if reqs == nil then
    -- wrk's main state checks the request once before any thread runs.
    return wrk.format("POST", wrk.path, { ["Content-Type"] = "application/json" }, "{}")
  end
  idx = idx + 1
  if idx > nreqs then
    if once then
      return "" -- every body sent: leave this connection idle
    end
    idx = 1
  end
  if sent == 0 then
    t0 = now()
  end
  sent = sent + 1
  return reqs[idx]
end

function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
  else
    other = other + 1
  end
  t1 = now()
end

function done(summary, latency, requests)
  local ok_total, other_total, sent_total = 0, 0, 0
  local first, last = nil, nil
  for _, thread in ipairs(threads) do
    ok_total = ok_total + thread:get("ok")
    other_total = other_total + thread:get("other")
    sent_total = sent_total + thread:get("sent")
    local a, b = thread:get("t0"), thread:get("t1")
    if a > 0 and (first == nil or a < first) then
      first = a
    end
    if b > 0 and (last == nil or b > last) then
      last = b
    end
  end
  local span = 0
  if first ~= nil and last ~= nil then
    span = last - first
  end
  io.write(string.format("BENCH ok=%d other=%d sent=%d span=%.6f\n", ok_total, other_total, sent_total, span))
end

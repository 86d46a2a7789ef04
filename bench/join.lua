-- wrk script: a flash sale's crowd queueing for one held asset. Every
-- request is a new buyer joining BENCH_ASSET's waiting list with a key of
-- its own; each thread stops once BENCH_JOINS / threads of them are queued
-- (201), or at its first 409 (WAITLIST_FULL: the service is started with
-- HOLDFAST_WAITLIST_MAX = BENCH_JOINS, and a stopped thread's requests in
-- flight still join), so that the run ends with the queue BENCH_JOINS long.
-- done() prints the statuses and the p50/p99 in µs.
local asset = os.getenv("BENCH_ASSET") or "FLASH"
local joins = tonumber(os.getenv("BENCH_JOINS") or "10000")
local thread_count = 0
local threads = {}

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function init(args)
  counter = 0
  queued = 0
  statuses = {}
  share = math.ceil(joins / thread_count)
  path = "/v1/assets/" .. asset .. "/waitlist"
end

function request()
  counter = counter + 1
  local buyer = string.format("w%d-%d", tid, counter)
  local headers = { ["Content-Type"] = "application/json", ["Idempotency-Key"] = "join-" .. buyer }
  return wrk.format("POST", path, headers, '{"buyer_id":"' .. buyer .. '"}')
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 201 then
    queued = queued + 1
    if queued >= share then
      wrk.thread:stop()
    end
  elseif status == 409 then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local totals = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      totals[status] = (totals[status] or 0) + n
    end
  end
  for status, n in pairs(totals) do
    io.write(string.format("STATUS %d %d\n", status, n))
  end
  io.write(string.format("REQUESTS %d SECONDS %.3f\n", summary.requests, summary.duration / 1e6))
  io.write(string.format("LATENCY p50=%d p99=%d\n", latency:percentile(50), latency:percentile(99)))
end

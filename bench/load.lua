-- wrk script for the holdfast benchmark. BENCH_MODE chooses the scenario:
--   ceiling      GET / (the minimal actix-web handler)
--   hot          POST a hold on BENCH_ASSET, a new key each time
--   spread       POST a hold on a different seeded asset each time, for a
--                new buyer each time (named after the asset)
--   hold-commit  hold a seeded asset, then commit that hold (two streams);
--                a new buyer for each hold
--   replay       the same key and body every time
-- Each thread counts statuses; done() prints them with p50/p99 in µs.
-- BENCH_THREAD_OFFSET numbers the threads from there (default 0).
local mode = os.getenv("BENCH_MODE") or "hot"
local asset = os.getenv("BENCH_ASSET") or "HOT"
local prefix = os.getenv("BENCH_PREFIX") or "S"
-- The first thread's number (the seeded assets are per thread): two wrk
-- processes splitting one scenario take threads 0 and 1.
local thread_count = tonumber(os.getenv("BENCH_THREAD_OFFSET") or "0")
local threads = {}

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function init(args)
  counter = 0
  statuses = {}
  commits = {}
  run = tostring(os.time()) .. "-" .. tostring(tid)
end

local function post(path, key, body)
  local headers = { ["Content-Type"] = "application/json", ["Idempotency-Key"] = key }
  return wrk.format("POST", path, headers, body)
end

function request()
  counter = counter + 1
  if mode == "ceiling" then
    return wrk.format("GET", "/")
  elseif mode == "hot" then
    return post("/v1/assets/" .. asset .. "/reservations", "h-" .. run .. "-" .. counter, '{"buyer_id":"b-' .. counter .. '"}')
  elseif mode == "spread" then
    local id = prefix .. "-" .. tid .. "-" .. counter
    return post("/v1/assets/" .. id .. "/reservations", "s-" .. run .. "-" .. counter, '{"buyer_id":"b-' .. id .. '"}')
  elseif mode == "hold-commit" then
    local pending = table.remove(commits)
    if pending then
      return post("/v1/reservations/" .. pending .. "/commit", "c-" .. pending, '{"payment_reference":"pay-' .. pending .. '"}')
    end
    local id = "H" .. prefix .. "-" .. tid .. "-" .. counter
    return post("/v1/assets/" .. id .. "/reservations", "hc-" .. run .. "-" .. counter, '{"buyer_id":"b-' .. id .. '"}')
  else -- replay
    return post("/v1/assets/" .. asset .. "/reservations", "replay-key", '{"buyer_id":"replayer"}')
  end
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if mode == "hold-commit" and status == 201 then
    local id = string.match(body, '"reservation_id":"(res_[0-9A-Z]+)"')
    if id then table.insert(commits, id) end
  end
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for k, v in pairs(s) do total[k] = (total[k] or 0) + v end
  end
  io.write("STATUSES")
  for k, v in pairs(total) do io.write(" " .. k .. "=" .. v) end
  io.write("\n")
  io.write(string.format("RESULT requests=%d seconds=%.3f p50=%d p99=%d errors=%d\n",
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end

-- An HAProxy action that asks ratelimiter whether a request may pass:
-- "http-request lua.ratelimit" (see haproxy.cfg). A denial is answered
-- to the client as ratelimiter wrote it (429, Retry-After, the RateLimit
-- headers, a problem); so is any answer but 200, so that a misconfigured
-- service is seen rather than ignored.
local auth = "http://127.0.0.1:8080/v1/forward-auth"

-- The request headers the rules of ratelimiter.yaml key by ("key:
-- header:<name>"), in lower case, passed on with the value the client
-- sent first: the subrequest carries no other header of the client's, so
-- a rule keyed by a header missing here never applies. Add yours.
local keyed_by = {"x-api-key"}

-- first returns the first value of a header of an httpclient response.
local function first(headers, name)
  local v = headers and headers[name]
  if type(v) == "table" then
    return v[0] or v[1]
  end
  return v
end

core.register_action("ratelimit", {"http-req"}, function(txn)
  -- The client's address, appended to whatever the client sent:
  -- ratelimiter reads it from the right.
  local xff = txn.f:src()
  local sent = txn.f:req_fhdr("x-forwarded-for")
  if sent and sent ~= "" then
    xff = sent .. ", " .. xff
  end
  -- Only these headers are sent, and those of keyed_by: the client cannot
  -- claim another method, host or path. pathq, not url: a request in
  -- absolute form ("POST http://host/login") has a url that is no path,
  -- which would match no rule by path.
  local headers = {
    ["x-forwarded-method"] = {txn.f:method()},
    ["x-forwarded-uri"] = {txn.f:pathq()},
    ["x-forwarded-host"] = {txn.f:req_hdr("host") or ""},
    ["x-forwarded-for"] = {xff},
  }
  local sent_headers = txn.http:req_get_headers()
  for _, name in ipairs(keyed_by) do
    local values = sent_headers[name]
    if values and values[0] then
      headers[name] = {values[0]}
    end
  end
  local res = core.httpclient():get{url = auth, timeout = 1000, headers = headers}
  if res and res.status == 200 then
    local rl, policy = first(res.headers, "ratelimit"), first(res.headers, "ratelimit-policy")
    if rl then
      txn:set_var("txn.ratelimit", rl)
      txn:set_var("txn.ratelimit_policy", policy or "")
    end
    return
  end
  local reply = txn:reply{status = res and res.status or 503}
  if res then
    for _, name in ipairs({"retry-after", "ratelimit", "ratelimit-policy", "content-type", "ratelimiter-degraded"}) do
      local v = first(res.headers, name)
      if v then
        reply:add_header(name, v)
      end
    end
    reply:set_body(res.body or "")
  end
  txn:done(reply)
end)

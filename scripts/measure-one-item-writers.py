#!/usr/bin/env python3
# Many writers PATCH one item at once (no If-Match): how many are answered
# 503 after the engine's bounded retries. Usage: PORT THREADS PER_THREAD
# against a running server with open sign-up.
import json, threading, http.client, sys, collections
PORT=int(sys.argv[1]); TH=int(sys.argv[2]); N=int(sys.argv[3])
def req(m, p, body=None, tok=None, hdr=None):
    c=http.client.HTTPConnection("127.0.0.1",PORT); h={"content-type":"application/json"}
    if tok: h["authorization"]="Bearer "+tok
    if hdr: h.update(hdr)
    c.request(m,"/api/v1"+p,json.dumps(body) if body is not None else None,h); r=c.getresponse(); b=r.read(); c.close()
    return r.status, b
req("POST","/users",{"username":"cc","password":"password1"})
tok=json.loads(req("POST","/sessions",{"username":"cc","password":"password1"})[1])["token"]
iid=json.loads(req("POST","/items",{"kind":"doc","properties":{"n":0}},tok=tok)[1])["id"]
cnt=collections.Counter()
def w(t):
    c=http.client.HTTPConnection("127.0.0.1",PORT)
    for i in range(N):
        c.request("PATCH","/api/v1/items/"+iid,json.dumps({"properties":{"t%d"%t:i}}),{"content-type":"application/json","authorization":"Bearer "+tok})
        r=c.getresponse(); r.read(); cnt[r.status]+=1
ts=[threading.Thread(target=w,args=(t,)) for t in range(TH)]
[t.start() for t in ts]; [t.join() for t in ts]
print(TH, dict(cnt))

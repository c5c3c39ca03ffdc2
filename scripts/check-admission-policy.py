#!/usr/bin/env python3
"""Compiles and evaluates deploy/admission-policy.yaml's CEL (both policies) on sample pods, without an API server.

Needs PyYAML and cel-python (`pip install pyyaml cel-python`); Kubernetes' own CEL environment
(types from the OpenAPI schema, its extension libraries) is only approximated: a real cluster
must still check the policy (`kubectl apply --dry-run=server -f deploy/admission-policy.yaml`).
Usage: scripts/check-admission-policy.py [deploy/admission-policy.yaml]; exit 1 on a wrong verdict.
"""
import yaml, celpy, sys
from celpy import celtypes
path=sys.argv[1] if len(sys.argv) > 1 else 'deploy/admission-policy.yaml'
docs=list(yaml.safe_load_all(open(path)))
env=celpy.Environment()
spec=docs[0]['spec']
# Kubernetes CEL has the strings extension (list.join); cel-python does not.
JOIN={"join": lambda l, sep: celtypes.StringType(str(sep).join(str(x) for x in l))}
def ev(expr, act): return env.program(env.compile(expr), functions=JOIN).evaluate(act)
def run(op, obj, old, user="alice", spec=spec, extra=None, sub=""):
    info={"username":user}
    if extra is not None: info["extra"]=extra
    act={"object":celpy.json_to_cel(obj),"oldObject":celpy.json_to_cel(old),"request":celpy.json_to_cel({"operation":op,"subResource":sub,"userInfo":info})}
    if not all(ev(m['expression'], act) for m in spec['matchConditions']): return "skipped"
    v={}
    for var in spec.get('variables', []):
        act["variables"]=celtypes.MapType({celtypes.StringType(k):x for k,x in v.items()})
        v[var['name']]=ev(var['expression'], act)
    act["variables"]=celtypes.MapType({celtypes.StringType(k):x for k,x in v.items()})
    out=[]
    for x in spec['validations']:
        r=ev(x['expression'], act); out.append(bool(r))
        if not r and 'messageExpression' in x: print("   msg:", ev(x['messageExpression'], act))
    return out
pod=lambda ann,node=None,sched="xshare-scheduler",labels=None: {"metadata":dict({"annotations":ann} if ann is not None else {}, **({"labels":labels} if labels is not None else {})), "spec":dict({"schedulerName":sched,"containers":[{"name":"c","resources":{"limits":{"xshare.io/offline-gpu":"1"}}}]}, **({"nodeName":node} if node else {}))}
plan={"xshare.io/gpu":"0","xshare.io/sm-percent":"40","xshare.io/memory-quota-bytes":"2147483648"}
cases=[("create plain", run("CREATE", pod({"a":"b"}), None), [True]*3),
("create preset plan", run("CREATE", pod(plan), None), [False,True,True]),
("create nodeName", run("CREATE", pod(None,"n1"), None), [True,True,False]),
("create default sched", run("CREATE", pod(None,None,"default-scheduler"), None), [True,False,True]),
("update same", run("UPDATE", pod(plan), pod(plan)), [True]*3),
("update raised", run("UPDATE", pod(dict(plan, **{"xshare.io/memory-quota-bytes":"85899345920"})), pod(plan)), [False,True,True]),
("update removed", run("UPDATE", pod({k:v for k,v in plan.items() if k!="xshare.io/memory-quota-bytes"}), pod(plan)), [False,True,True]),
("update added", run("UPDATE", pod(plan), pod({"a":"b"})), [False,True,True]),
("update no ann", run("UPDATE", pod(None), pod(None)), [True]*3),
("online create with gpu", run("CREATE", {"metadata":{"annotations":{"xshare.io/gpu":"1"}},"spec":{"containers":[{"name":"c"}]}}, None), [True]*3),
("online create with quota", run("CREATE", {"metadata":{"annotations":{"xshare.io/memory-quota-bytes":"1"}},"spec":{"containers":[{"name":"c"}]}}, None), [False,True,True]),
("init container asks", run("CREATE", {"metadata":{"annotations":{"xshare.io/gpu":"1"}},"spec":{"schedulerName":"xshare-scheduler","initContainers":[{"name":"i","resources":{"requests":{"xshare.io/offline-gpu":"1"}}}],"containers":[{"name":"c"}]}}, None), [False,True,True]),
("extender update", run("UPDATE", pod(plan), pod({}), user="system:serviceaccount:kube-system:xshare-extender"), "skipped"),
("tenant adds kubelet eviction", run("UPDATE", pod(dict(plan, **{"xshare.io/kubelet-eviction":'{"node":"n1","since_unix_ms":1,"node_pressure":true}'})), pod(plan)), [False,True,True]),
("create with kubelet eviction", run("CREATE", pod({"xshare.io/kubelet-eviction":"{}"}), None), [False,True,True]),
("extender adds kubelet eviction", run("UPDATE", pod(dict(plan, **{"xshare.io/kubelet-eviction":"{}"})), pod(plan), user="system:serviceaccount:kube-system:xshare-extender"), "skipped"),
]
# Once bound, the plan's view of the job is frozen (4th validation).
ident=dict(plan, **{"xshare.io/memory-mib":"4000"}); role={"xshare.io/role":"offline"}
cases=[(n, g if g=="skipped" else g, (w+[True]) if isinstance(w, list) else w) for n, g, w in cases]
cases+=[("bound: memory-mib edited", run("UPDATE", pod(dict(ident, **{"xshare.io/memory-mib":"x"}),"n1",labels=role), pod(ident,"n1",labels=role)), [True,True,True,False]),
("bound: role label removed", run("UPDATE", pod(ident,"n1",labels={}), pod(ident,"n1",labels=role)), [True,True,True,False]),
("bound: offline-job label added", run("UPDATE", pod(ident,"n1",labels=dict(role, **{"xshare.io/offline-job":"other"})), pod(ident,"n1",labels=role)), [True,True,True,False]),
("bound: other label changed", run("UPDATE", pod(ident,"n1",labels=dict(role, team="b")), pod(ident,"n1",labels=dict(role, team="a"))), [True]*4),
("bound: Job controller's job-name label edited", run("UPDATE", pod(ident,"n1",labels=dict(role, **{"batch.kubernetes.io/job-name":"j1"})), pod(ident,"n1",labels=dict(role, **{"batch.kubernetes.io/job-name":"j2"}))), [True,True,True,False]),
("bound: tenant label added", run("UPDATE", pod(ident,"n1",labels=dict(role, **{"xshare.io/tenant":"other"})), pod(ident,"n1",labels=role)), [True,True,True,False]),
("pending: memory-mib edited", run("UPDATE", pod(dict(ident, **{"xshare.io/memory-mib":"5000"}),labels=role), pod(ident,labels=role)), [True]*4),
]
# What node-agent may change (the second policy): an online pod's xshare.io/gpu on its own node.
agent_spec=docs[2]['spec']; AGENT="system:serviceaccount:kube-system:xshare-node-agent"
on_node={"authentication.kubernetes.io/node-name":["n1"]}
online=lambda ann,node="n1",labels=None,image="svc:1": {"metadata":{"annotations":ann,"labels":labels if labels is not None else {"xshare.io/role":"online","app":"svc"}},"spec":{"nodeName":node,"containers":[{"name":"c","image":image,"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}
agent=lambda op, obj, old, extra=on_node, sub="": run(op, obj, old, user=AGENT, spec=agent_spec, extra=extra, sub=sub)
cases+=[("agent writes the online pod's gpu", agent("UPDATE", online({"a":"b","xshare.io/gpu":"0"}), online({"a":"b"})), [True,True]),
("agent corrects the online pod's gpu", agent("UPDATE", online({"xshare.io/gpu":"1"}), online({"xshare.io/gpu":"0"})), [True,True]),
("agent on another node's pod", agent("UPDATE", online({"xshare.io/gpu":"0"},"n2"), online({},"n2")), [False,True]),
("agent token without node name", agent("UPDATE", online({"xshare.io/gpu":"0"}), online({}), extra={}), [False,True]),
("agent on an offline pod", agent("UPDATE", online({"xshare.io/gpu":"0"},labels={"xshare.io/role":"offline"}), online({},labels={"xshare.io/role":"offline"})), [False,True]),
("agent changes an image", agent("UPDATE", online({"xshare.io/gpu":"0"},image="evil:1"), online({})), [True,False]),
("agent changes a label", agent("UPDATE", online({},labels={"xshare.io/role":"online","app":"x"}), online({})), [True,False]),
("agent changes another annotation", agent("UPDATE", online({"a":"c"}), online({"a":"b"})), [True,False]),
("agent removes another annotation", agent("UPDATE", online({}), online({"a":"b"})), [True,False]),
("agent creates a pod", agent("CREATE", online({}), None), [False,False]),
("agent patches status", agent("UPDATE", online({"xshare.io/gpu":"0"}), online({}), sub="status"), [False,True]),
("someone else, agent policy", run("UPDATE", online({"xshare.io/gpu":"0"}), online({}), spec=agent_spec), "skipped"),
]
bad=0
for name, got, want in cases:
    print(("ok  " if got==want else "BAD "), name, got); bad += got!=want
sys.exit(1 if bad else 0)

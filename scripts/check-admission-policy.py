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
# The namespace of the request, labelled as offline pods' namespaces must be.
OFFLINE_NS={"metadata":{"name":"ml","labels":{"xshare.io/offline-workloads":"true"}}}
def run(op, obj, old, user="alice", spec=spec, extra=None, sub="", ns=OFFLINE_NS):
    info={"username":user}
    if extra is not None: info["extra"]=extra
    act={"object":celpy.json_to_cel(obj),"oldObject":celpy.json_to_cel(old),"namespaceObject":celpy.json_to_cel(ns),
         "request":celpy.json_to_cel({"operation":op,"subResource":sub,"namespace":(ns or {}).get("metadata",{}).get("name",""),"userInfo":info})}
    if not all(ev(m['expression'], act) for m in spec['matchConditions']): return "skipped"
    v={}
    for var in spec.get('variables', []):
        act["variables"]=celtypes.MapType({celtypes.StringType(k):x for k,x in v.items()})
        v[var['name']]=ev(var['expression'], act)
    act["variables"]=celtypes.MapType({celtypes.StringType(k):x for k,x in v.items()})
    out=[]
    for x in spec['validations']:
        # An expression that fails to evaluate denies the request (failurePolicy: Fail).
        try: r=ev(x['expression'], act)
        except celpy.CELEvalError: out.append("error"); continue
        out.append(bool(r))
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
# The cases above were written for the validations [plan keys, schedulerName, nodeName, bound
# freeze]; the policy now has [plan keys, role label needs the resource, schedulerName,
# namespace label, nodeName, bound freeze, mount paths]: the new ones pass in those cases.
def v7(w): return [w[0], True, w[1], True, w[2], w[3], True] if isinstance(w, list) else w
cases+=[("bound: memory-mib edited", run("UPDATE", pod(dict(ident, **{"xshare.io/memory-mib":"x"}),"n1",labels=role), pod(ident,"n1",labels=role)), [True,True,True,False]),
("bound: role label removed", run("UPDATE", pod(ident,"n1",labels={}), pod(ident,"n1",labels=role)), [True,True,True,False]),
("bound: offline-job label added", run("UPDATE", pod(ident,"n1",labels=dict(role, **{"xshare.io/offline-job":"other"})), pod(ident,"n1",labels=role)), [True,True,True,False]),
("bound: other label changed", run("UPDATE", pod(ident,"n1",labels=dict(role, team="b")), pod(ident,"n1",labels=dict(role, team="a"))), [True]*4),
("bound: Job controller's job-name label edited", run("UPDATE", pod(ident,"n1",labels=dict(role, **{"batch.kubernetes.io/job-name":"j1"})), pod(ident,"n1",labels=dict(role, **{"batch.kubernetes.io/job-name":"j2"}))), [True,True,True,False]),
("bound: tenant label added", run("UPDATE", pod(ident,"n1",labels=dict(role, **{"xshare.io/tenant":"other"})), pod(ident,"n1",labels=role)), [True,True,True,False]),
("pending: memory-mib edited", run("UPDATE", pod(dict(ident, **{"xshare.io/memory-mib":"5000"}),labels=role), pod(ident,labels=role)), [True]*4),
]
cases=[(n, g, v7(w)) for n, g, w in cases]
# A pod labelled offline must ask for the resource (1); offline pods only in labelled
# namespaces (3); no mount at or under what Allocate injects (6).
bare=lambda labels,node=None,mounts=None,init=False: {"metadata":{"labels":labels,"annotations":{"xshare.io/gpu":"0","xshare.io/memory-mib":"80000"}},
    "spec":dict({"containers":[{"name":"c","image":"pause","volumeMounts":mounts or []}]}, **({"nodeName":node} if node else {}))}
def asks(p, init=False):
    c={"name":"i" if init else "c","resources":{"limits":{"xshare.io/offline-gpu":"1"}}}
    if init: p["spec"]["initContainers"]=[c]
    else: p["spec"]["containers"][0]["resources"]=c["resources"]
    p["spec"]["schedulerName"]="xshare-scheduler"; return p
def mounted(path, init=False):
    p=asks(bare(role), init)
    p["metadata"]["annotations"]={}
    (p["spec"]["initContainers"][0] if init else p["spec"]["containers"][0])["volumeMounts"]=[{"name":"v","mountPath":path}]
    return p
OK7=[True]*7
def only(i): return [j!=i for j in range(7)]
def fails(*ix): return [j not in ix for j in range(7)]
cases+=[
("fake offline pause pod with nodeName", run("CREATE", bare(role,"gpu-node-7"), None), fails(0,1)),
("fake offline pod, no plan annotations", run("CREATE", {"metadata":{"labels":role},"spec":{"nodeName":"n7","containers":[{"name":"c"}]}}, None), only(1)),
("offline label added to a pod without the resource", run("UPDATE", {"metadata":{"labels":role},"spec":{"containers":[{"name":"c"}]}}, {"metadata":{"labels":{}},"spec":{"containers":[{"name":"c"}]}}), only(1)),
("old pod labelled offline without the resource, status update", run("UPDATE", {"metadata":{"labels":role},"spec":{"containers":[{"name":"c"}]}}, {"metadata":{"labels":role},"spec":{"containers":[{"name":"c"}]}}, sub="status"), OK7),
("online-labelled pod without the resource: not this policy's", run("CREATE", {"metadata":{"labels":{"xshare.io/role":"online"}},"spec":{"nodeName":"n7","containers":[{"name":"c"}]}}, None), OK7),
("offline pod in an unlabelled namespace", run("CREATE", pod({}), None, ns={"metadata":{"name":"team-b"}}), only(3)),
("offline pod in kube-system even if labelled", run("CREATE", pod({}), None, ns={"metadata":{"name":"kube-system","labels":{"xshare.io/offline-workloads":"true"}}}), only(3)),
("offline pod, namespace label false", run("CREATE", pod({}), None, ns={"metadata":{"name":"ml","labels":{"xshare.io/offline-workloads":"false"}}}), only(3)),
("plain pod in an unlabelled namespace", run("CREATE", {"metadata":{},"spec":{"containers":[{"name":"c"}]}}, None, ns={"metadata":{"name":"team-b"}}), OK7),
("offline mounts a ConfigMap at the status dir", run("CREATE", mounted("/run/xshare/status"), None), only(6)),
("offline mounts at the termination file", run("CREATE", mounted("/run/xshare/termination"), None), only(6)),
("offline mounts at the ledger dir", run("CREATE", mounted("/run/xshare"), None), only(6)),
("offline mounts under the pipe dir", run("CREATE", mounted("/run/xshare/gpu0/mps-pipe/control"), None), only(6)),
("offline mounts over /var/run/xshare", run("CREATE", mounted("/var/run/xshare/status"), None), only(6)),
("offline mounts over the shim", run("CREATE", mounted("/usr/local/lib/xshare/libxcuda.so"), None), only(6)),
("offline mounts its own /dev/shm", run("CREATE", mounted("/dev/shm"), None), only(6)),
("offline init container mounts the status dir", run("CREATE", mounted("/run/xshare/status", init=True), None), only(6)),
("offline mount path with a trailing slash", run("CREATE", mounted("/run/xshare/status/"), None), only(6)),
("offline mount path with //", run("CREATE", mounted("/run//xshare/status"), None), only(6)),
("offline mount path with /./", run("CREATE", mounted("/run/./xshare/status"), None), only(6)),
("offline mount path with ..", run("CREATE", mounted("/data/../run/xshare/status"), None), only(6)),
("offline mounts /run (a parent, mounted first)", run("CREATE", mounted("/run"), None), OK7),
("offline mounts a sibling /run/xshared", run("CREATE", mounted("/run/xshared"), None), OK7),
("offline mounts its data", run("CREATE", mounted("/data/set.1"), None), OK7),
("online pod mounts /dev/shm", run("CREATE", {"metadata":{},"spec":{"containers":[{"name":"c","volumeMounts":[{"name":"v","mountPath":"/dev/shm"}]}]}}, None), OK7),
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
# What node-agent may change on a Node (xshare-node-agent-nodes) and where it may evict
# (xshare-node-agent-evictions).
nodes_spec=docs[4]['spec']; evict_spec=docs[6]['spec']
HB, LOCK = "xshare.io/gpu-heartbeat", "xshare.io/bind-lock"
def node(ann, name="n1", labels=None, taints=None):
    return {"metadata":{"name":name,"annotations":ann,"labels":labels if labels is not None else {"kubernetes.io/hostname":name}},
            "spec":{"podCIDR":"10.0.0.0/24", **({"taints":taints} if taints else {})}}
nagent=lambda op, obj, old, extra=on_node, sub="": run(op, obj, old, user=AGENT, spec=nodes_spec, extra=extra, sub=sub, ns=None)
base={"a":"b", HB:"{}"}; locked=dict(base, **{LOCK:'{"uid":"u"}'})
cases+=[("agent writes its heartbeat", nagent("UPDATE", node(dict(base, **{HB:"{1}"})), node(base)), [True,True]),
("agent adds its first heartbeat", nagent("UPDATE", node({"a":"b",HB:"{}"}), node({"a":"b"})), [True,True]),
("agent gives the bind lock back", nagent("UPDATE", node(base), node(locked)), [True,True]),
("agent takes the bind lock", nagent("UPDATE", node(locked), node(base)), [True,False]),
("agent changes the bind lock", nagent("UPDATE", node(dict(locked, **{LOCK:'{"uid":"v"}'})), node(locked)), [True,False]),
("agent on another node", nagent("UPDATE", node(dict(base, **{HB:"{1}"}),"n2"), node(base,"n2")), [False,True]),
("agent token without node name, node", nagent("UPDATE", node(base), node(base), extra={}), [False,True]),
("agent sets a label (nodeSelector)", nagent("UPDATE", node(base, labels={"kubernetes.io/hostname":"n1","team":"x"}), node(base)), [True,False]),
("agent removes a taint", nagent("UPDATE", node(base), node(base, taints=[{"key":"k","effect":"NoSchedule"}])), [True,False]),
("agent changes another annotation", nagent("UPDATE", node(dict(base, a="c")), node(base)), [True,False]),
("agent removes another annotation", nagent("UPDATE", node({HB:"{}"}), node(base)), [True,False]),
("agent patches node status", nagent("UPDATE", node(base), node(base), sub="status"), [False,True]),
("agent deletes a node (the first validation denies it; the second reads a null object)", nagent("DELETE", None, node(base)), [False,False]),
("someone else, node policy", run("UPDATE", node({}), node(base), spec=nodes_spec, ns=None), "skipped"),
]
eviction={"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"train-0","namespace":"ml"},"deleteOptions":{"preconditions":{"uid":"u1"}}}
eagent=lambda ns: run("CREATE", eviction, None, user=AGENT, spec=evict_spec, extra=on_node, ns=ns)
cases+=[("agent evicts in a labelled namespace", eagent(OFFLINE_NS), [True]),
("agent evicts in an unlabelled namespace", eagent({"metadata":{"name":"web"}}), [False]),
("agent evicts in kube-system, labelled", eagent({"metadata":{"name":"kube-system","labels":{"xshare.io/offline-workloads":"true"}}}), [False]),
("someone else evicts", run("CREATE", eviction, None, spec=evict_spec, ns={"metadata":{"name":"web"}}), "skipped"),
]
bad=0
for name, got, want in cases:
    print(("ok  " if got==want else "BAD "), name, got); bad += got!=want
sys.exit(1 if bad else 0)

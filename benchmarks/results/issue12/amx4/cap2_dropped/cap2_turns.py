import sys, json, statistics, dataclasses
from triforce import LLM, SamplingParams
caps=[int(c) for c in sys.argv[1].split(',')]; temp=float(sys.argv[2]); turns=int(sys.argv[3]); batch=int(sys.argv[4]) if len(sys.argv)>4 else 8
llm = LLM("smollm2", None, "auto", prefix_cache_gb=4)
import glob
texts=sorted(glob.glob('/work/shared/data/austen-*.txt'))
prompts=[]
for i in range(batch):
    ids=llm.tokenizer(open(texts[i%len(texts)]).read())["input_ids"]
    prompts.append(ids[(i//len(texts))*7936:(i//len(texts)+1)*7936])
base=llm.config
llm.config=dataclasses.replace(base, mode="ar")
llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
llm.config=dataclasses.replace(base, mode="triforce")
res={c:[] for c in caps}
texts_out={}
for t in range(turns):
    order=caps if t%2==0 else caps[::-1]
    for c in order:
        llm.config=dataclasses.replace(base, mode="triforce", cap2=c)
        outs=llm.generate(prompts, SamplingParams(max_tokens=128, temperature=temp, seed=t, ignore_eos=True))
        sp=sum(len(o.token_ids) for o in outs)/max(o.metrics.decode_s for o in outs)
        res[c].append(sp)
        if temp == 0:  # greedy: every cap gives the same tokens (the check is exact whatever it holds)
            got=[o.token_ids for o in outs]
            assert texts_out.setdefault(t, got) == got, "greedy output differs between caps"
        tiers={}
        for o in outs:
            for st in o.metrics.tiers:
                d=tiers.setdefault(st.name,[0,0,0.0,0])
                d[0]+=st.checks; d[1]+=st.proposed; d[2]=max(d[2],st.seconds); d[3]+=sum(n for k,n in st.accepted_lengths.items() if k>=9)
        print(json.dumps({"turn":t,"cap":c,"tokens_per_s":round(sp,1),"decode_s":round(max(o.metrics.decode_s for o in outs),2),"tiers":{k:[v[0],round(v[1]/max(v[0],1),2),round(v[2],2),v[3]] for k,v in tiers.items()}}), flush=True)
print(json.dumps({"temperature":temp,"batch":batch, **{f"cap{c}":round(statistics.median(v),1) for c,v in res.items()}}))

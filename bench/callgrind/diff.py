# Per-function instructions per action, client B minus client A, from
# run.sh outputs in DIR: diff.py DIR tagA clientA tagB clientB N self|inc TOP
# ("self": each function's own instructions; "inc": with its callees, which
# callgrind double-counts through Go's goroutine switches and recursion).
import re,sys,subprocess,collections
def load(path, inclusive):
    args=['callgrind_annotate','--threshold=100','--auto=no','--tree=none']
    if inclusive: args.append('--inclusive=yes')
    out=subprocess.run(args+[path],capture_output=True,text=True).stdout
    d=collections.Counter()
    for line in out.splitlines():
        m=re.match(r'\s*([\d,]+)\s+\([^)]*\)\s+(\S.*)$',line)
        if not m or 'PROGRAM TOTALS' in line: continue
        name=m.group(2)
        name=re.sub(r' \[.*\]$','',name)
        name=name.split(':',1)[1] if ':' in name else name
        name=re.sub(r"'\d+$","",name)
        d[name]+=int(m.group(1).replace(',',''))
    return d
def per_action(tag,c,n,inc):
    a=load(f'{tag}.{c}.0.out',inc); b=load(f'{tag}.{c}.{n}.out',inc)
    return {k:(b[k]-a.get(k,0))/n for k in set(a)|set(b)}
import os
os.chdir(sys.argv[1])
tagA,cA,tagB,cB,n,inc,top=sys.argv[2],sys.argv[3],sys.argv[4],sys.argv[5],int(sys.argv[6]),sys.argv[7]=='inc',int(sys.argv[8])
A=per_action(tagA,cA,n,inc); B=per_action(tagB,cB,n,inc)
keys=set(A)|set(B)
diffs=sorted(((B.get(k,0)-A.get(k,0),k) for k in keys),key=lambda x:-abs(x[0]))
print(f"{'diff':>9} {tagA+'.'+cA:>12} {tagB+'.'+cB:>12}  function ({'inclusive' if inc else 'self'}, instr/action)")
for d,k in diffs[:top]:
    print(f"{d:9.0f} {A.get(k,0):12.0f} {B.get(k,0):12.0f}  {k}")
print(f"sum of all self diffs: {sum(B.get(k,0)-A.get(k,0) for k in keys):.0f}" if not inc else "")

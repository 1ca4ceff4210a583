"""Per build and temperature: auto's and draft's tokens/s in each turn, their ratio, its median (ab.sh's runs)."""
import json, glob, statistics
rows = {}
for f in sorted(glob.glob(__file__.rsplit('/', 1)[0] + '/*_turn*.json')):
    b, t = f.split('/')[-1][:-5].split('_turn')
    r = json.load(open(f))
    for x in r['results']:
        rows.setdefault((b, x['temperature']), {}).setdefault(int(t), {})[x['run']] = x['tokens_per_s']
for (b, temp), turns in sorted(rows.items()):
    ratios = [v['auto'] / v['draft'] for v in turns.values()]
    print(b, temp, 'auto', [round(v['auto'], 1) for v in turns.values()],
          'draft', [round(v['draft'], 1) for v in turns.values()],
          'ratio', [round(x, 2) for x in ratios], 'median', round(statistics.median(ratios), 3))

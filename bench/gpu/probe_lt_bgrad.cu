// Whether cuBLASLt has algorithms for a product with its bias gradient in the epilogue
// (CUBLASLT_EPILOGUE_BGRADB: the sums of op(B) over K, a linear layer's bias gradient beside
// its weight gradient), per type and layout, and whether they run and sum right. A probe for
// kernel set 50's question (bench/gpu/session.sh lt_probe), not a benchmark.
//   nvcc -O2 -o /tmp/probe bench/gpu/probe_lt_bgrad.cu -lcublasLt && /tmp/probe
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <cmath>

static void probe(cublasLtHandle_t lt, int N, int M, int K, cudaDataType_t type, cublasComputeType_t compute,
                  cublasOperation_t opa, cublasOperation_t opb, cublasLtEpilogue_t epilogue, const char * label) {
    size_t es = type == CUDA_R_32F ? 4 : 2;
    std::vector<float> ha((size_t) N*K), hb((size_t) M*K);
    for (size_t i = 0; i < ha.size(); ++i) ha[i] = (float) ((i*7919) % 13) / 13.0f - 0.5f;
    for (size_t i = 0; i < hb.size(); ++i) hb[i] = (float) ((i*104729) % 17) / 17.0f - 0.5f;
    void *a, *b, *d, *bias, *ws;
    cudaMalloc(&a, ha.size()*4); cudaMalloc(&b, hb.size()*4); cudaMalloc(&d, (size_t) N*M*4);
    cudaMalloc(&bias, (size_t) (M > N ? M : N)*4); cudaMalloc(&ws, 32 << 20);
    if (type == CUDA_R_32F) {
        cudaMemcpy(a, ha.data(), ha.size()*4, cudaMemcpyHostToDevice);
        cudaMemcpy(b, hb.data(), hb.size()*4, cudaMemcpyHostToDevice);
    }
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, type, opa == CUBLAS_OP_N ? N : K, opa == CUBLAS_OP_N ? K : N, opa == CUBLAS_OP_N ? N : K);
    cublasLtMatrixLayoutCreate(&lb, type, opb == CUBLAS_OP_N ? K : M, opb == CUBLAS_OP_N ? M : K, opb == CUBLAS_OP_N ? K : M);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t wsize = 32 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsize, sizeof(wsize));
    cublasLtMatmulHeuristicResult_t found[8];
    int count = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, found, &count);
    int unsplit = 0;
    for (int i = 0; i < count; ++i) {
        int32_t splits = 1; size_t w = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &w);
        unsplit += splits <= 1;
    }
    double err = -1;
    float ms = -1;
    if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
        float alpha = 1, beta = 0;
        cublasStatus_t run = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &found[0].algo, ws,
                                            found[0].workspaceSize, 0);
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        cudaEventRecord(e0);
        for (int r = 0; r < 20; ++r) {
            cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &found[0].algo, ws, found[0].workspaceSize, 0);
        }
        cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&ms, e0, e1); ms /= 20;
        if (run == CUBLAS_STATUS_SUCCESS && type == CUDA_R_32F && epilogue == CUBLASLT_EPILOGUE_BGRADB) {
            std::vector<float> hbias(M);
            cudaMemcpy(hbias.data(), bias, M*4, cudaMemcpyDeviceToHost);
            err = 0;
            for (int m = 0; m < M; ++m) {  // op(B) is K x M: column m's sum over k
                double s = 0;
                for (int k = 0; k < K; ++k) s += opb == CUBLAS_OP_N ? hb[(size_t) m*K + k] : hb[(size_t) k*M + m];
                err = fmax(err, fabs(s - hbias[m]) / (1 + fabs(s)));
            }
        } else if (run != CUBLAS_STATUS_SUCCESS) {
            err = -2;
        }
    }
    printf("%-26s N=%5d M=%5d K=%5d opa=%c opb=%c: status %d, %d algorithms (%d without split-K), err %.2e, %.4f ms\n",
           label, N, M, K, opa == CUBLAS_OP_N ? 'N' : 'T', opb == CUBLAS_OP_N ? 'N' : 'T', (int) st, count, unsplit, err, ms);
    cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld); cublasLtMatmulDescDestroy(desc);
    cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(bias); cudaFree(ws);
}

int main() {
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    const int shapes[][3] = {{64, 64, 64}, {10, 64, 64}, {64, 10, 64}, {784, 512, 128}, {512, 512, 128}, {4096, 4096, 512},
                             {512, 1536, 8192}, {512, 2048, 8192}};
    for (auto & s : shapes) {
        for (cublasOperation_t opb : {CUBLAS_OP_T, CUBLAS_OP_N}) {
            probe(lt, s[0], s[1], s[2], CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_OP_N, opb, CUBLASLT_EPILOGUE_BGRADB, "f32 tf32 BGRADB");
            probe(lt, s[0], s[1], s[2], CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, opb, CUBLASLT_EPILOGUE_BGRADB, "f32 BGRADB");
            probe(lt, s[0], s[1], s[2], CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, opb, CUBLASLT_EPILOGUE_BGRADB, "bf16 BGRADB");
            probe(lt, s[0], s[1], s[2], CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_OP_N, opb, CUBLASLT_EPILOGUE_DEFAULT, "f32 tf32 none");
        }
    }
    return 0;
}
